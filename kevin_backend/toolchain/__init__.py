"""Building C++/CUDA: the candidate's parsed form, the host/device split, the fast build, the whole
build, and compiler errors placed in the candidate's own lines. Imports only the foundation."""
