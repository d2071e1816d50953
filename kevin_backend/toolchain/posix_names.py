"""The C library's functions host code may not name: those of the C and POSIX headers that torch's
extension header brings in (unistd.h, pthread.h, sched.h, time.h, sys/stat.h, and of stdio.h and
stdlib.h all but formatting, conversion, memory and sorting), which reach files, processes,
threads, signals, time, users, locales or the environment. Math, string and memory functions are
not among them. static_cpp.py refuses these names in host code unless the program declares a
variable or defines a function of that name itself."""

from __future__ import annotations

__all__ = ["POSIX_NAMES"]

_BY_HEADER = {
    "unistd.h": """
        _Fork _exit access acct alarm brk chdir chown chroot close close_range closefrom confstr crypt daemon dup
        dup2 dup3 eaccess endusershell euidaccess execl execle execlp execv execve execveat execvp execvpe faccessat
        fchdir fchown fchownat fdatasync fexecve fork fpathconf fsync ftruncate ftruncate64 get_current_dir_name
        getcwd getdomainname getdtablesize getegid geteuid getgid getgroups gethostid gethostname getlogin
        getlogin_r getopt getpagesize getpass getpgid getpgrp getpid getppid getresgid getresuid getsid gettid
        getuid getusershell getwd group_member isatty lchown link linkat lockf lockf64 lseek lseek64 nice pathconf
        pause pipe pipe2 pread pread64 profil pwrite pwrite64 read readlink readlinkat revoke rmdir sbrk
        setdomainname setegid seteuid setgid sethostid sethostname setlogin setpgid setpgrp setregid setresgid
        setresuid setreuid setsid setuid setusershell sleep swab symlink symlinkat sync syncfs syscall sysconf
        tcgetpgrp tcsetpgrp truncate truncate64 ttyname ttyname_r ttyslot ualarm unlink unlinkat usleep vfork
        vhangup write
    """,
    "pthread.h, sched.h": """
        clone getcpu pthread_atfork pthread_attr_destroy pthread_attr_getaffinity_np pthread_attr_getdetachstate
        pthread_attr_getguardsize pthread_attr_getinheritsched pthread_attr_getschedparam
        pthread_attr_getschedpolicy pthread_attr_getscope pthread_attr_getsigmask_np pthread_attr_getstack
        pthread_attr_getstackaddr pthread_attr_getstacksize pthread_attr_init pthread_attr_setaffinity_np
        pthread_attr_setdetachstate pthread_attr_setguardsize pthread_attr_setinheritsched
        pthread_attr_setschedparam pthread_attr_setschedpolicy pthread_attr_setscope pthread_attr_setsigmask_np
        pthread_attr_setstack pthread_attr_setstackaddr pthread_attr_setstacksize pthread_barrier_destroy
        pthread_barrier_init pthread_barrier_wait pthread_barrierattr_destroy pthread_barrierattr_getpshared
        pthread_barrierattr_init pthread_barrierattr_setpshared pthread_cancel pthread_clockjoin_np
        pthread_cond_broadcast pthread_cond_clockwait pthread_cond_destroy pthread_cond_init pthread_cond_signal
        pthread_cond_timedwait pthread_cond_wait pthread_condattr_destroy pthread_condattr_getclock
        pthread_condattr_getpshared pthread_condattr_init pthread_condattr_setclock pthread_condattr_setpshared
        pthread_create pthread_detach pthread_equal pthread_exit pthread_getaffinity_np pthread_getattr_default_np
        pthread_getattr_np pthread_getconcurrency pthread_getcpuclockid pthread_getname_np pthread_getschedparam
        pthread_getspecific pthread_join pthread_key_create pthread_key_delete pthread_mutex_clocklock
        pthread_mutex_consistent pthread_mutex_consistent_np pthread_mutex_destroy pthread_mutex_getprioceiling
        pthread_mutex_init pthread_mutex_lock pthread_mutex_setprioceiling pthread_mutex_timedlock
        pthread_mutex_trylock pthread_mutex_unlock pthread_mutexattr_destroy pthread_mutexattr_getprioceiling
        pthread_mutexattr_getprotocol pthread_mutexattr_getpshared pthread_mutexattr_getrobust
        pthread_mutexattr_getrobust_np pthread_mutexattr_gettype pthread_mutexattr_init
        pthread_mutexattr_setprioceiling pthread_mutexattr_setprotocol pthread_mutexattr_setpshared
        pthread_mutexattr_setrobust pthread_mutexattr_setrobust_np pthread_mutexattr_settype pthread_once
        pthread_rwlock_clockrdlock pthread_rwlock_clockwrlock pthread_rwlock_destroy pthread_rwlock_init
        pthread_rwlock_rdlock pthread_rwlock_timedrdlock pthread_rwlock_timedwrlock pthread_rwlock_tryrdlock
        pthread_rwlock_trywrlock pthread_rwlock_unlock pthread_rwlock_wrlock pthread_rwlockattr_destroy
        pthread_rwlockattr_getkind_np pthread_rwlockattr_getpshared pthread_rwlockattr_init
        pthread_rwlockattr_setkind_np pthread_rwlockattr_setpshared pthread_self pthread_setaffinity_np
        pthread_setattr_default_np pthread_setcancelstate pthread_setcanceltype pthread_setconcurrency
        pthread_setname_np pthread_setschedparam pthread_setschedprio pthread_setspecific pthread_spin_destroy
        pthread_spin_init pthread_spin_lock pthread_spin_trylock pthread_spin_unlock pthread_testcancel
        pthread_timedjoin_np pthread_tryjoin_np pthread_yield sched_get_priority_max sched_get_priority_min
        sched_getaffinity sched_getcpu sched_getparam sched_getscheduler sched_rr_get_interval sched_setaffinity
        sched_setparam sched_setscheduler sched_yield setns unshare
    """,
    "time.h, sys/time.h, sys/select.h": """
        adjtime asctime asctime_r clock clock_adjtime clock_getcpuclockid clock_getres clock_gettime clock_nanosleep
        clock_settime ctime ctime_r difftime dysize futimes futimesat getdate getdate_r getitimer gettimeofday
        gmtime gmtime_r localtime localtime_r lutimes mktime nanosleep pselect select setitimer settimeofday
        strftime strftime_l strptime strptime_l time timegm timelocal timer_create timer_delete timer_getoverrun
        timer_gettime timer_settime timespec_get timespec_getres tzset utimes
    """,
    "sys/stat.h": """
        chmod fchmod fchmodat fstat fstat64 fstatat fstatat64 futimens getumask lchmod lstat lstat64 mkdir mkdirat
        mkfifo mkfifoat mknod mknodat stat stat64 umask utimensat
    """,
    "stdlib.h": """
        a64l arc4random arc4random_buf arc4random_uniform at_quick_exit atexit canonicalize_file_name clearenv
        drand48 drand48_r ecvt ecvt_r erand48 erand48_r fcvt fcvt_r gcvt getenv getloadavg getpt getsubopt grantpt
        initstate initstate_r jrand48 jrand48_r l64a lcong48 lcong48_r lrand48 lrand48_r mblen mbstowcs mbtowc
        mkdtemp mkostemp mkostemp64 mkostemps mkostemps64 mkstemp mkstemp64 mkstemps mkstemps64 mktemp mrand48
        mrand48_r nrand48 nrand48_r on_exit posix_openpt ptsname ptsname_r putenv qecvt qecvt_r qfcvt qfcvt_r qgcvt
        qsort_r quick_exit rand_r random random_r reallocarray realpath rpmatch secure_getenv seed48 seed48_r setenv
        setstate setstate_r srand48 srand48_r srandom srandom_r strfromd strfromf strfromf128 strfromf32 strfromf32x
        strfromf64 strfromf64x strfroml strtod_l strtof128 strtof128_l strtof32 strtof32_l strtof32x strtof32x_l
        strtof64 strtof64_l strtof64x strtof64x_l strtof_l strtol_l strtold_l strtoll_l strtoq strtoul_l strtoull_l
        strtouq system unlockpt unsetenv valloc wcstombs wctomb
    """,
    "stdio.h": """
        asprintf clearerr clearerr_unlocked ctermid cuserid dprintf fclose fcloseall fdopen feof feof_unlocked
        ferror ferror_unlocked fflush_unlocked fgetc fgetc_unlocked fgetpos fgetpos64 fgets fgets_unlocked fileno
        fileno_unlocked flockfile fmemopen fopen fopen64 fopencookie fputc_unlocked fputs_unlocked fread
        fread_unlocked freopen freopen64 fscanf fseek fseeko fseeko64 fsetpos fsetpos64 ftell ftello ftello64
        ftrylockfile funlockfile fwrite_unlocked getc getc_unlocked getchar getchar_unlocked getdelim getline getw
        obstack_printf obstack_vprintf open_memstream open_wmemstream pclose popen putc_unlocked putchar_unlocked
        putw remove rename renameat renameat2 rewind scanf setbuf setbuffer setlinebuf setvbuf tempnam tmpfile
        tmpfile64 tmpnam tmpnam_r ungetc vasprintf vdprintf vfscanf vscanf vsscanf
    """,
    "locale.h, libintl.h": """
        bind_textdomain_codeset bindtextdomain dcgettext dcngettext dgettext dngettext duplocale freelocale gettext
        localeconv newlocale ngettext setlocale textdomain uselocale
    """,
}

POSIX_NAMES = frozenset(name for names in _BY_HEADER.values() for name in names.split())
