//: Index reductions: a thread's running (value, position), then the row's. Torch's rules: the
//: first position of the largest (smallest) value, and a NaN beats every number (its first position).
__device__ __forceinline__ void kevin_arg_step_max(float& v, int64_t& i, float x, int64_t j) {
    if (!(v != v) && (x > v || x != x)) { v = x; i = j; }
}
__device__ __forceinline__ void kevin_arg_step_min(float& v, int64_t& i, float x, int64_t j) {
    if (!(v != v) && (x < v || x != x)) { v = x; i = j; }
}
__device__ __forceinline__ void kevin_arg_join_max(float& v, int64_t& i, float x, int64_t j) {
    const bool vn = v != v, xn = x != x;
    if ((xn && (!vn || j < i)) || (!vn && !xn && (x > v || (x == v && j < i)))) { v = x; i = j; }
}
__device__ __forceinline__ void kevin_arg_join_min(float& v, int64_t& i, float x, int64_t j) {
    const bool vn = v != v, xn = x != x;
    if ((xn && (!vn || j < i)) || (!vn && !xn && (x < v || (x == v && j < i)))) { v = x; i = j; }
}
