/* record_fs: an LD_PRELOAD shim that logs the file-system operations a
 * process makes under one directory tree, for the crash-state explorer
 * (tests/crashstate/explore.py, docs/RELIABILITY.md "Crash states").
 *
 *   MHCKPT_REC_ROOT=/abs/root   only paths equal to it or below it are logged
 *   MHCKPT_REC_OUT=/abs/dir     where the logs go (outside the root):
 *                               ops.<pid>.log  one line per operation
 *                               data.<pid>.bin the bytes of every write
 *
 * A log line is "key=value" fields separated by spaces; values never hold a
 * space except `path` and `path2`, which come last and are %-escaped.
 *   t0, t1   CLOCK_MONOTONIC ns before the call and after it returned
 *   pid tid op ret err fd ino dev mode flags off len blob path path2
 * Every call is forwarded to libc unchanged; a failed call is logged with
 * ret=-1 and its errno, and the explorer ignores it.
 *
 * Intercepted: open/open64/openat/openat64/creat/creat64 and the fortified
 * __open_2 family; close; write/writev/pwrite/pwrite64/pwritev/pwritev64/
 * pwritev2 (the bytes are logged); ftruncate/truncate (and 64); fallocate,
 * posix_fallocate (and 64); fsync, fdatasync, sync_file_range, sync, syncfs;
 * rename/renameat/renameat2; unlink/unlinkat/rmdir/remove; mkdir/mkdirat;
 * dup/dup2/dup3; mmap/mmap64/munmap/msync/mremap.
 *
 * A shared writable mapping of a file under the root (MAP_SHARED with
 * PROT_WRITE) is followed: its stores are not calls, so the shim logs the
 * mapping's bytes as one op=mmap_write of the whole mapping (with the file's
 * dev and ino) whenever they may reach the file's durable state — before an
 * fsync/fdatasync of that file by this process, at msync, at munmap, and at
 * exit for a mapping still in place. The explorer treats it as a write that
 * returned then: a crash before it shows the file without the stores (their
 * pages not written back), after it any subset of its pages. msync is given
 * no durability of its own (the library does not call it; that is the
 * cautious reading). A partial munmap or an mremap of such a mapping is
 * logged as op=unsupported.
 *
 * Things the explorer cannot model are logged as op=unsupported
 * when they touch the root (link, symlink, a stdio stream opened for writing,
 * aio_write, libaio's io_submit, copy_file_range), so
 * that it refuses the trace instead of building wrong states (io_uring is
 * invisible here: a write missed makes explore.py's replay differ from the
 * saved root, which stops it). An O_DIRECT open is recorded like any other
 * (its flags are logged): direct writes are not durable before an fsync
 * either. */
#define _GNU_SOURCE
#include <aio.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/aio_abi.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MAX_FDS 65536
#define LINE_MAX_BYTES (3 * PATH_MAX + 512)

struct tracked {
  int on;     /* the fd names a file or directory under the root */
  int is_dir; /* a directory (fsync of it makes its entries durable) */
  dev_t dev;
  ino_t ino;
  int flags;
};

static struct tracked g_fds[MAX_FDS];
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_root[PATH_MAX];
static size_t g_root_len;
static char g_out[PATH_MAX];
static int g_enabled = -1; /* -1: not looked at yet */
static pid_t g_log_pid;
static int g_log_fd = -1, g_bin_fd = -1;
static uint64_t g_bin_off;

/* ---- the real functions ---- */
#define REAL(name) real_##name
#define DECL(ret, name, ...)             \
  typedef ret (*name##_fn)(__VA_ARGS__); \
  static name##_fn real_##name;
DECL(int, open, const char*, int, ...)
DECL(int, open64, const char*, int, ...)
DECL(int, openat, int, const char*, int, ...)
DECL(int, openat64, int, const char*, int, ...)
DECL(int, close, int)
DECL(ssize_t, write, int, const void*, size_t)
DECL(ssize_t, writev, int, const struct iovec*, int)
DECL(ssize_t, pwrite, int, const void*, size_t, off_t)
DECL(ssize_t, pwrite64, int, const void*, size_t, off64_t)
DECL(ssize_t, pwritev, int, const struct iovec*, int, off_t)
DECL(ssize_t, pwritev64, int, const struct iovec*, int, off64_t)
DECL(ssize_t, pwritev2, int, const struct iovec*, int, off_t, int)
DECL(int, ftruncate, int, off_t)
DECL(int, ftruncate64, int, off64_t)
DECL(int, truncate, const char*, off_t)
DECL(int, truncate64, const char*, off64_t)
DECL(int, fallocate, int, int, off_t, off_t)
DECL(int, fallocate64, int, int, off64_t, off64_t)
DECL(int, posix_fallocate, int, off_t, off_t)
DECL(int, posix_fallocate64, int, off64_t, off64_t)
DECL(int, fsync, int)
DECL(int, fdatasync, int)
DECL(int, sync_file_range, int, off64_t, off64_t, unsigned int)
DECL(void, sync, void)
DECL(int, syncfs, int)
DECL(int, rename, const char*, const char*)
DECL(int, renameat, int, const char*, int, const char*)
DECL(int, renameat2, int, const char*, int, const char*, unsigned int)
DECL(int, unlink, const char*)
DECL(int, unlinkat, int, const char*, int)
DECL(int, rmdir, const char*)
DECL(int, remove, const char*)
DECL(int, mkdir, const char*, mode_t)
DECL(int, mkdirat, int, const char*, mode_t)
DECL(int, dup, int)
DECL(int, dup2, int, int)
DECL(int, dup3, int, int, int)
DECL(int, link, const char*, const char*)
DECL(int, linkat, int, const char*, int, const char*, int)
DECL(int, symlink, const char*, const char*)
DECL(FILE*, fopen, const char*, const char*)
DECL(FILE*, fopen64, const char*, const char*)
DECL(void*, mmap, void*, size_t, int, int, int, off_t)
DECL(void*, mmap64, void*, size_t, int, int, int, off64_t)
DECL(int, munmap, void*, size_t)
DECL(int, msync, void*, size_t, int)
DECL(void*, mremap, void*, size_t, size_t, int, ...)
DECL(int, aio_write, struct aiocb*)
DECL(long, io_submit, aio_context_t, long, struct iocb**)
DECL(ssize_t, copy_file_range, int, loff_t*, int, loff_t*, size_t, unsigned int)

static void* resolve(const char* name) {
  void* p = dlsym(RTLD_NEXT, name);
  if (!p) {
    static const char msg[] = "record_fs: a libc function is missing\n";
    syscall(SYS_write, 2, msg, sizeof msg - 1);
    abort();
  }
  return p;
}
#define ENSURE(name) \
  if (!real_##name) real_##name = (name##_fn)resolve(#name)

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- configuration and paths ---- */

static int enabled(void) {
  if (g_enabled >= 0) return g_enabled;
  const char* root = getenv("MHCKPT_REC_ROOT");
  const char* out = getenv("MHCKPT_REC_OUT");
  if (!root || !out || root[0] != '/' || out[0] != '/' || strlen(root) >= PATH_MAX ||
      strlen(out) >= PATH_MAX) {
    g_enabled = 0;
    return 0;
  }
  strcpy(g_root, root);
  g_root_len = strlen(g_root);
  while (g_root_len > 1 && g_root[g_root_len - 1] == '/') g_root[--g_root_len] = '\0';
  strcpy(g_out, out);
  g_enabled = 1;
  return 1;
}

/* Lexically normalises an absolute path in place: "//", "." and "..". */
static void normalise(char* p) {
  char out[PATH_MAX];
  size_t n = 0;
  const char* s = p;
  while (*s) {
    while (*s == '/') s++;
    if (!*s) break;
    const char* e = s;
    while (*e && *e != '/') e++;
    size_t len = (size_t)(e - s);
    if (len == 1 && s[0] == '.') {
      /* nothing */
    } else if (len == 2 && s[0] == '.' && s[1] == '.') {
      while (n > 0 && out[n - 1] != '/') n--;
      if (n > 0) n--;
    } else if (n + 1 + len < PATH_MAX) {
      out[n++] = '/';
      memcpy(out + n, s, len);
      n += len;
    }
    s = e;
  }
  if (n == 0) out[n++] = '/';
  out[n] = '\0';
  strcpy(p, out);
}

/* The absolute form of `path` relative to `dirfd` (AT_FDCWD: the working
 * directory), in `out`; 0 if it cannot be made. */
static int absolute(int dirfd, const char* path, char* out) {
  if (!path) return 0;
  if (path[0] == '/') {
    if (strlen(path) >= PATH_MAX) return 0;
    strcpy(out, path);
  } else {
    char base[PATH_MAX];
    if (dirfd == AT_FDCWD) {
      if (!getcwd(base, sizeof base)) return 0;
    } else {
      char link[64];
      snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
      ssize_t n = readlink(link, base, sizeof base - 1);
      if (n <= 0) return 0;
      base[n] = '\0';
    }
    size_t nb = strlen(base), np = strlen(path);
    if (nb + 1 + np >= PATH_MAX) return 0;
    memcpy(out, base, nb);
    out[nb] = '/';
    memcpy(out + nb + 1, path, np + 1);
  }
  normalise(out);
  return 1;
}

static int under_root(const char* abs) {
  return strncmp(abs, g_root, g_root_len) == 0 &&
         (abs[g_root_len] == '\0' || abs[g_root_len] == '/');
}

/* `abs` if the call touches the root (abs filled in), else 0. */
static int watched(int dirfd, const char* path, char* abs) {
  return enabled() && absolute(dirfd, path, abs) && under_root(abs);
}

static int fd_watched(int fd) { return fd >= 0 && fd < MAX_FDS && g_fds[fd].on; }

/* ---- the log ---- */

static void escape(const char* in, char* out, size_t cap) {
  size_t n = 0;
  for (; *in && n + 4 < cap; in++) {
    unsigned char c = (unsigned char)*in;
    if (c <= ' ' || c == '%' || c >= 127) {
      n += (size_t)snprintf(out + n, cap - n, "%%%02X", c);
    } else {
      out[n++] = (char)c;
    }
  }
  out[n] = '\0';
}

static void write_all(int fd, const void* p, size_t n) {
  const char* c = (const char*)p;
  while (n > 0) {
    ssize_t w = (ssize_t)syscall(SYS_write, fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    c += w;
    n -= (size_t)w;
  }
}

/* Opens this process's log files (again after a fork). Called with g_mu held. */
static int open_logs(void) {
  pid_t pid = getpid();
  if (g_log_fd >= 0 && g_log_pid == pid) return 1;
  char path[PATH_MAX + 64];
  snprintf(path, sizeof path, "%s/ops.%d.log", g_out, (int)pid);
  g_log_fd =
      (int)syscall(SYS_openat, AT_FDCWD, path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  snprintf(path, sizeof path, "%s/data.%d.bin", g_out, (int)pid);
  g_bin_fd =
      (int)syscall(SYS_openat, AT_FDCWD, path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  g_bin_off = 0;
  g_log_pid = pid;
  return g_log_fd >= 0 && g_bin_fd >= 0;
}

struct event {
  const char* op;
  uint64_t t0, t1;
  long ret;
  int err, fd;
  long long flags, off, len;
  const char* path;  /* absolute, or NULL: the fd's */
  const char* path2; /* rename's target */
  const struct iovec* iov;
  int iovcnt;   /* the bytes written (ret of them), if any */
  int has_node; /* dev and ino below, not the fd's (a mapping's write) */
  dev_t dev;
  ino_t ino;
};

static void log_event(const struct event* e) {
  char line[LINE_MAX_BYTES], p1[PATH_MAX * 3 / 2], p2[PATH_MAX * 3 / 2];
  struct tracked t = {0};
  int saved_errno = errno;
  pthread_mutex_lock(&g_mu);
  if (!open_logs()) goto out;
  if (e->fd >= 0 && e->fd < MAX_FDS) t = g_fds[e->fd];
  if (e->has_node) {
    t.dev = e->dev;
    t.ino = e->ino;
  }
  long long blob = -1;
  if (e->iov && e->ret > 0) {
    blob = (long long)g_bin_off;
    size_t left = (size_t)e->ret;
    for (int i = 0; i < e->iovcnt && left > 0; i++) {
      size_t n = e->iov[i].iov_len < left ? e->iov[i].iov_len : left;
      write_all(g_bin_fd, e->iov[i].iov_base, n);
      left -= n;
    }
    g_bin_off += (uint64_t)e->ret;
  }
  escape(e->path ? e->path : "", p1, sizeof p1);
  escape(e->path2 ? e->path2 : "", p2, sizeof p2);
  int n = snprintf(line, sizeof line,
                   "t0=%llu t1=%llu pid=%d tid=%ld op=%s ret=%ld err=%d fd=%d ino=%llu dev=%llu "
                   "dir=%d oflags=%d flags=%lld off=%lld len=%lld blob=%lld path=%s path2=%s\n",
                   (unsigned long long)e->t0, (unsigned long long)e->t1, (int)getpid(),
                   (long)syscall(SYS_gettid), e->op, e->ret, e->err, e->fd,
                   (unsigned long long)t.ino, (unsigned long long)t.dev, t.is_dir, t.flags,
                   e->flags, e->off, e->len, blob, p1, p2);
  if (n > 0) write_all(g_log_fd, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
out:
  pthread_mutex_unlock(&g_mu);
  errno = saved_errno;
}

static void track(int fd, int flags) {
  if (fd < 0 || fd >= MAX_FDS) return;
  struct stat st;
  if (fstat(fd, &st) != 0) return;
  pthread_mutex_lock(&g_mu);
  g_fds[fd].on = 1;
  g_fds[fd].is_dir = S_ISDIR(st.st_mode);
  g_fds[fd].dev = st.st_dev;
  g_fds[fd].ino = st.st_ino;
  g_fds[fd].flags = flags;
  pthread_mutex_unlock(&g_mu);
}

static void untrack(int fd) {
  if (fd < 0 || fd >= MAX_FDS) return;
  pthread_mutex_lock(&g_mu);
  memset(&g_fds[fd], 0, sizeof g_fds[fd]);
  pthread_mutex_unlock(&g_mu);
}

static void log_simple(const char* op, uint64_t t0, long ret, int err, int fd, long long flags,
                       long long off, long long len, const char* path, const char* path2) {
  struct event e = {op, t0, now_ns(), ret, err, fd, flags, off, len, path, path2, NULL, 0, 0, 0, 0};
  log_event(&e);
}

static void log_unsupported(const char* what, const char* path) {
  log_simple("unsupported", now_ns(), 0, 0, -1, 0, 0, 0, path, what);
}

/* ---- opens ---- */

static int after_open(const char* op, uint64_t t0, int fd, int err, int flags, const char* abs) {
  if (fd >= 0) {
    if (fd >= MAX_FDS) log_unsupported("fd_beyond_table", abs);
    track(fd, flags);
  }
  log_simple(op, t0, fd, err, fd, flags, 0, 0, abs, NULL);
  errno = err;
  return fd;
}

static int do_openat(const char* op, int dirfd, const char* path, int flags, mode_t mode,
                     int (*call)(int, const char*, int, mode_t)) {
  char abs[PATH_MAX];
  if (!watched(dirfd, path, abs)) return call(dirfd, path, flags, mode);
  uint64_t t0 = now_ns();
  int fd = call(dirfd, path, flags, mode);
  return after_open(op, t0, fd, errno, flags, abs);
}

static int call_open(int dirfd, const char* p, int f, mode_t m) {
  ENSURE(open);
  (void)dirfd;
  return real_open(p, f, m);
}
static int call_open64(int dirfd, const char* p, int f, mode_t m) {
  ENSURE(open64);
  (void)dirfd;
  return real_open64(p, f, m);
}
static int call_openat(int dirfd, const char* p, int f, mode_t m) {
  ENSURE(openat);
  return real_openat(dirfd, p, f, m);
}
static int call_openat64(int dirfd, const char* p, int f, mode_t m) {
  ENSURE(openat64);
  return real_openat64(dirfd, p, f, m);
}

static mode_t mode_arg(int flags, va_list ap) {
  return (flags & O_CREAT) || (flags & __O_TMPFILE) == __O_TMPFILE ? (mode_t)va_arg(ap, int) : 0;
}

int open(const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t m = mode_arg(flags, ap);
  va_end(ap);
  return do_openat("open", AT_FDCWD, path, flags, m, call_open);
}
int open64(const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t m = mode_arg(flags, ap);
  va_end(ap);
  return do_openat("open", AT_FDCWD, path, flags, m, call_open64);
}
int openat(int dirfd, const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t m = mode_arg(flags, ap);
  va_end(ap);
  return do_openat("open", dirfd, path, flags, m, call_openat);
}
int openat64(int dirfd, const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t m = mode_arg(flags, ap);
  va_end(ap);
  return do_openat("open", dirfd, path, flags, m, call_openat64);
}
int __open_2(const char* path, int flags) { return open(path, flags); }
int __open64_2(const char* path, int flags) { return open64(path, flags); }
int __openat_2(int dirfd, const char* path, int flags) { return openat(dirfd, path, flags); }
int __openat64_2(int dirfd, const char* path, int flags) { return openat64(dirfd, path, flags); }
int creat(const char* path, mode_t mode) { return open(path, O_CREAT | O_WRONLY | O_TRUNC, mode); }
int creat64(const char* path, mode_t mode) {
  return open64(path, O_CREAT | O_WRONLY | O_TRUNC, mode);
}

int close(int fd) {
  ENSURE(close);
  if (!fd_watched(fd)) return real_close(fd);
  uint64_t t0 = now_ns();
  int rc = real_close(fd);
  int err = errno;
  log_simple("close", t0, rc, err, fd, 0, 0, 0, NULL, NULL);
  untrack(fd);
  errno = err;
  return rc;
}

static int after_dup(int oldfd, int newfd) {
  if (newfd >= 0 && newfd < MAX_FDS && fd_watched(oldfd)) {
    pthread_mutex_lock(&g_mu);
    g_fds[newfd] = g_fds[oldfd];
    pthread_mutex_unlock(&g_mu);
  } else if (newfd >= 0 && newfd < MAX_FDS) {
    untrack(newfd);
  }
  return newfd;
}
int dup(int fd) {
  ENSURE(dup);
  int r = real_dup(fd);
  int err = errno;
  after_dup(fd, r);
  errno = err;
  return r;
}
int dup2(int fd, int fd2) {
  ENSURE(dup2);
  int r = real_dup2(fd, fd2);
  int err = errno;
  if (r >= 0 && fd != fd2) after_dup(fd, r);
  errno = err;
  return r;
}
int dup3(int fd, int fd2, int flags) {
  ENSURE(dup3);
  int r = real_dup3(fd, fd2, flags);
  int err = errno;
  if (r >= 0) after_dup(fd, r);
  errno = err;
  return r;
}

/* ---- writes ---- */

static ssize_t log_write(const char* op, int fd, uint64_t t0, ssize_t r, int err, long long off,
                         size_t len, const struct iovec* iov, int iovcnt) {
  struct event e = {op,   t0,   now_ns(), (long)r, err, fd, 0, off, (long long)len,
                    NULL, NULL, iov,      iovcnt,  0,   0,  0};
  log_event(&e);
  errno = err;
  return r;
}

static size_t iov_total(const struct iovec* iov, int n) {
  size_t s = 0;
  for (int i = 0; i < n; i++) s += iov[i].iov_len;
  return s;
}

/* write/writev: the offset is where the file position was before the call. */
static ssize_t positioned(int fd, const struct iovec* iov, int n, uint64_t t0, ssize_t r, int err) {
  long long off = -1;
  if (r >= 0) off = (long long)lseek(fd, 0, SEEK_CUR) - r;
  return log_write("write", fd, t0, r, err, off, iov_total(iov, n), iov, n);
}

ssize_t write(int fd, const void* buf, size_t n) {
  ENSURE(write);
  if (!fd_watched(fd)) return real_write(fd, buf, n);
  uint64_t t0 = now_ns();
  ssize_t r = real_write(fd, buf, n);
  struct iovec v = {(void*)buf, n};
  return positioned(fd, &v, 1, t0, r, errno);
}
ssize_t writev(int fd, const struct iovec* iov, int n) {
  ENSURE(writev);
  if (!fd_watched(fd)) return real_writev(fd, iov, n);
  uint64_t t0 = now_ns();
  ssize_t r = real_writev(fd, iov, n);
  return positioned(fd, iov, n, t0, r, errno);
}
ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) {
  ENSURE(pwrite);
  if (!fd_watched(fd)) return real_pwrite(fd, buf, n, off);
  uint64_t t0 = now_ns();
  ssize_t r = real_pwrite(fd, buf, n, off);
  struct iovec v = {(void*)buf, n};
  return log_write("write", fd, t0, r, errno, (long long)off, n, &v, 1);
}
ssize_t pwrite64(int fd, const void* buf, size_t n, off64_t off) {
  ENSURE(pwrite64);
  if (!fd_watched(fd)) return real_pwrite64(fd, buf, n, off);
  uint64_t t0 = now_ns();
  ssize_t r = real_pwrite64(fd, buf, n, off);
  struct iovec v = {(void*)buf, n};
  return log_write("write", fd, t0, r, errno, (long long)off, n, &v, 1);
}
ssize_t pwritev(int fd, const struct iovec* iov, int n, off_t off) {
  ENSURE(pwritev);
  if (!fd_watched(fd)) return real_pwritev(fd, iov, n, off);
  uint64_t t0 = now_ns();
  ssize_t r = real_pwritev(fd, iov, n, off);
  return log_write("write", fd, t0, r, errno, (long long)off, iov_total(iov, n), iov, n);
}
ssize_t pwritev64(int fd, const struct iovec* iov, int n, off64_t off) {
  ENSURE(pwritev64);
  if (!fd_watched(fd)) return real_pwritev64(fd, iov, n, off);
  uint64_t t0 = now_ns();
  ssize_t r = real_pwritev64(fd, iov, n, off);
  return log_write("write", fd, t0, r, errno, (long long)off, iov_total(iov, n), iov, n);
}
ssize_t pwritev2(int fd, const struct iovec* iov, int n, off_t off, int flags) {
  ENSURE(pwritev2);
  if (!fd_watched(fd)) return real_pwritev2(fd, iov, n, off, flags);
  uint64_t t0 = now_ns();
  ssize_t r = real_pwritev2(fd, iov, n, off, flags);
  int err = errno;
  if (off == -1) return positioned(fd, iov, n, t0, r, err);
  return log_write("write", fd, t0, r, err, (long long)off, iov_total(iov, n), iov, n);
}

/* ---- sizes ---- */

int ftruncate(int fd, off_t len) {
  ENSURE(ftruncate);
  if (!fd_watched(fd)) return real_ftruncate(fd, len);
  uint64_t t0 = now_ns();
  int r = real_ftruncate(fd, len);
  int err = errno;
  log_simple("truncate", t0, r, err, fd, 0, 0, (long long)len, NULL, NULL);
  errno = err;
  return r;
}
int ftruncate64(int fd, off64_t len) {
  ENSURE(ftruncate64);
  if (!fd_watched(fd)) return real_ftruncate64(fd, len);
  uint64_t t0 = now_ns();
  int r = real_ftruncate64(fd, len);
  int err = errno;
  log_simple("truncate", t0, r, err, fd, 0, 0, (long long)len, NULL, NULL);
  errno = err;
  return r;
}
/* truncate by path: logged as an open, a truncate and a close of the file. */
static int path_truncate(long long len, int r, int err, uint64_t t0, const char* abs) {
  log_simple("truncate_path", t0, r, err, -1, 0, 0, len, abs, NULL);
  errno = err;
  return r;
}
int truncate(const char* path, off_t len) {
  ENSURE(truncate);
  char abs[PATH_MAX];
  if (!watched(AT_FDCWD, path, abs)) return real_truncate(path, len);
  uint64_t t0 = now_ns();
  int r = real_truncate(path, len);
  return path_truncate((long long)len, r, errno, t0, abs);
}
int truncate64(const char* path, off64_t len) {
  ENSURE(truncate64);
  char abs[PATH_MAX];
  if (!watched(AT_FDCWD, path, abs)) return real_truncate64(path, len);
  uint64_t t0 = now_ns();
  int r = real_truncate64(path, len);
  return path_truncate((long long)len, r, errno, t0, abs);
}

static int log_fallocate(int fd, uint64_t t0, int r, int err, int mode, long long off,
                         long long len) {
  log_simple("fallocate", t0, r, err, fd, mode, off, len, NULL, NULL);
  errno = err;
  return r;
}
int fallocate(int fd, int mode, off_t off, off_t len) {
  ENSURE(fallocate);
  if (!fd_watched(fd)) return real_fallocate(fd, mode, off, len);
  uint64_t t0 = now_ns();
  int r = real_fallocate(fd, mode, off, len);
  return log_fallocate(fd, t0, r, errno, mode, off, len);
}
int fallocate64(int fd, int mode, off64_t off, off64_t len) {
  ENSURE(fallocate64);
  if (!fd_watched(fd)) return real_fallocate64(fd, mode, off, len);
  uint64_t t0 = now_ns();
  int r = real_fallocate64(fd, mode, off, len);
  return log_fallocate(fd, t0, r, errno, mode, off, len);
}
/* posix_fallocate returns the error instead of setting errno. */
int posix_fallocate(int fd, off_t off, off_t len) {
  ENSURE(posix_fallocate);
  if (!fd_watched(fd)) return real_posix_fallocate(fd, off, len);
  uint64_t t0 = now_ns();
  int r = real_posix_fallocate(fd, off, len);
  int saved = errno;
  log_fallocate(fd, t0, r == 0 ? 0 : -1, r, 0, off, len);
  errno = saved;
  return r;
}
int posix_fallocate64(int fd, off64_t off, off64_t len) {
  ENSURE(posix_fallocate64);
  if (!fd_watched(fd)) return real_posix_fallocate64(fd, off, len);
  uint64_t t0 = now_ns();
  int r = real_posix_fallocate64(fd, off, len);
  int saved = errno;
  log_fallocate(fd, t0, r == 0 ? 0 : -1, r, 0, off, len);
  errno = saved;
  return r;
}

/* ---- shared writable mappings ---- */

#define MAX_MAPS 4096
struct mapping {
  char* addr; /* NULL: a free slot */
  size_t len;
  off_t off;
  dev_t dev;
  ino_t ino;
};
static struct mapping g_maps[MAX_MAPS];
static pthread_mutex_t g_maps_mu = PTHREAD_MUTEX_INITIALIZER;

/* Logs the bytes of mapping `m` as a write of its file. */
static void log_mapping(const struct mapping* m) {
  uint64_t t = now_ns();
  struct iovec v = {m->addr, m->len};
  struct event e = {
      "mmap_write",      t,    now_ns(), (long)m->len, 0, -1, 0,      (long long)m->off,
      (long long)m->len, NULL, NULL,     &v,           1, 1,  m->dev, m->ino};
  log_event(&e);
}

/* Logs every mapping of the file behind `fd` (before its fsync). */
static void log_mappings_of_fd(int fd) {
  if (!fd_watched(fd)) return;
  dev_t dev = g_fds[fd].dev;
  ino_t ino = g_fds[fd].ino;
  pthread_mutex_lock(&g_maps_mu);
  for (int i = 0; i < MAX_MAPS; i++) {
    if (g_maps[i].addr && g_maps[i].dev == dev && g_maps[i].ino == ino) log_mapping(&g_maps[i]);
  }
  pthread_mutex_unlock(&g_maps_mu);
}

/* Logs the mappings that overlap [addr, addr+len); with `drop`, forgets
 * them (munmap), logging a partial unmap as unsupported. */
static void log_mappings_in(void* addr, size_t len, int drop) {
  char* lo = (char*)addr;
  char* hi = lo + len;
  pthread_mutex_lock(&g_maps_mu);
  for (int i = 0; i < MAX_MAPS; i++) {
    struct mapping* m = &g_maps[i];
    if (!m->addr || m->addr + m->len <= lo || m->addr >= hi) continue;
    log_mapping(m);
    if (!drop) continue;
    if (lo > m->addr || hi < m->addr + m->len) log_unsupported("partial_munmap", "");
    memset(m, 0, sizeof *m);
  }
  pthread_mutex_unlock(&g_maps_mu);
}

static void* after_map(void* p, size_t len, int prot, int flags, int fd, off_t off) {
  if (p == MAP_FAILED || !(prot & PROT_WRITE) || !(flags & MAP_SHARED) || !fd_watched(fd)) {
    return p;
  }
  int err = errno;
  pthread_mutex_lock(&g_maps_mu);
  int i = 0;
  while (i < MAX_MAPS && g_maps[i].addr) i++;
  if (i < MAX_MAPS) {
    g_maps[i].addr = (char*)p;
    g_maps[i].len = len;
    g_maps[i].off = off;
    g_maps[i].dev = g_fds[fd].dev;
    g_maps[i].ino = g_fds[fd].ino;
  }
  pthread_mutex_unlock(&g_maps_mu);
  if (i == MAX_MAPS) log_unsupported("too_many_mappings", "");
  errno = err;
  return p;
}

void* mmap(void* addr, size_t len, int prot, int flags, int fd, off_t off) {
  ENSURE(mmap);
  return after_map(real_mmap(addr, len, prot, flags, fd, off), len, prot, flags, fd, off);
}
void* mmap64(void* addr, size_t len, int prot, int flags, int fd, off64_t off) {
  ENSURE(mmap64);
  return after_map(real_mmap64(addr, len, prot, flags, fd, off), len, prot, flags, fd, off);
}
int munmap(void* addr, size_t len) {
  ENSURE(munmap);
  if (enabled()) log_mappings_in(addr, len, 1);
  return real_munmap(addr, len);
}
int msync(void* addr, size_t len, int flags) {
  ENSURE(msync);
  if (enabled()) log_mappings_in(addr, len, 0);
  return real_msync(addr, len, flags);
}
void* mremap(void* old, size_t old_len, size_t new_len, int flags, ...) {
  ENSURE(mremap);
  void* target = NULL;
  if (flags & MREMAP_FIXED) {
    va_list ap;
    va_start(ap, flags);
    target = va_arg(ap, void*);
    va_end(ap);
  }
  if (enabled()) {
    pthread_mutex_lock(&g_maps_mu);
    for (int i = 0; i < MAX_MAPS; i++) {
      if (g_maps[i].addr && (char*)old < g_maps[i].addr + g_maps[i].len &&
          (char*)old + old_len > g_maps[i].addr) {
        log_unsupported("mremap", "");
      }
    }
    pthread_mutex_unlock(&g_maps_mu);
  }
  return real_mremap(old, old_len, new_len, flags, target);
}

/* A process that exits with a mapping in place leaves its stores in the
 * page cache as munmap would. */
__attribute__((destructor)) static void log_mappings_at_exit(void) {
  if (enabled()) log_mappings_in((void*)0, (size_t)-1, 1);
}

/* ---- durability ---- */

int fsync(int fd) {
  ENSURE(fsync);
  if (!fd_watched(fd)) return real_fsync(fd);
  log_mappings_of_fd(fd);
  uint64_t t0 = now_ns();
  int r = real_fsync(fd);
  int err = errno;
  log_simple("fsync", t0, r, err, fd, 0, 0, 0, NULL, NULL);
  errno = err;
  return r;
}
int fdatasync(int fd) {
  ENSURE(fdatasync);
  if (!fd_watched(fd)) return real_fdatasync(fd);
  log_mappings_of_fd(fd);
  uint64_t t0 = now_ns();
  int r = real_fdatasync(fd);
  int err = errno;
  log_simple("fdatasync", t0, r, err, fd, 0, 0, 0, NULL, NULL);
  errno = err;
  return r;
}
/* sync_file_range makes nothing durable (no metadata, no device flush): the
 * explorer logs it and gives it no effect. */
int sync_file_range(int fd, off64_t off, off64_t n, unsigned int flags) {
  ENSURE(sync_file_range);
  if (!fd_watched(fd)) return real_sync_file_range(fd, off, n, flags);
  uint64_t t0 = now_ns();
  int r = real_sync_file_range(fd, off, n, flags);
  int err = errno;
  log_simple("sync_file_range", t0, r, err, fd, flags, off, n, NULL, NULL);
  errno = err;
  return r;
}
void sync(void) {
  ENSURE(sync);
  if (!enabled()) return real_sync();
  uint64_t t0 = now_ns();
  real_sync();
  log_simple("sync", t0, 0, 0, -1, 0, 0, 0, NULL, NULL);
}
int syncfs(int fd) {
  ENSURE(syncfs);
  if (!enabled()) return real_syncfs(fd);
  uint64_t t0 = now_ns();
  int r = real_syncfs(fd);
  int err = errno;
  log_simple("sync", t0, r, err, -1, 0, 0, 0, NULL, NULL);
  errno = err;
  return r;
}

/* ---- names ---- */

static int log_names(const char* op, uint64_t t0, int r, int err, long long flags, const char* a,
                     const char* b) {
  log_simple(op, t0, r, err, -1, flags, 0, 0, a, b);
  errno = err;
  return r;
}

static int do_rename(int d1, const char* from, int d2, const char* to, unsigned flags, int which) {
  char a[PATH_MAX], b[PATH_MAX];
  int wa = watched(d1, from, a), wb = watched(d2, to, b);
  uint64_t t0 = now_ns();
  int r;
  if (which == 0) {
    ENSURE(rename);
    r = real_rename(from, to);
  } else if (which == 1) {
    ENSURE(renameat);
    r = real_renameat(d1, from, d2, to);
  } else {
    ENSURE(renameat2);
    r = real_renameat2(d1, from, d2, to, flags);
  }
  int err = errno;
  if (!wa && !wb) return errno = err, r;
  if (wa != wb) log_unsupported("rename_across_root", wa ? a : b);
  return log_names("rename", t0, r, err, flags, a, b);
}
int rename(const char* from, const char* to) {
  return do_rename(AT_FDCWD, from, AT_FDCWD, to, 0, 0);
}
int renameat(int d1, const char* from, int d2, const char* to) {
  return do_rename(d1, from, d2, to, 0, 1);
}
int renameat2(int d1, const char* from, int d2, const char* to, unsigned int flags) {
  /* RENAME_EXCHANGE (logged as a rename with its flag) is modelled; the others are not. */
  if (flags != 0 && flags != RENAME_EXCHANGE) {
    char a[PATH_MAX];
    if (watched(d1, from, a)) log_unsupported("renameat2_flags", a);
  }
  return do_rename(d1, from, d2, to, flags, 2);
}

int unlink(const char* path) {
  ENSURE(unlink);
  char a[PATH_MAX];
  if (!watched(AT_FDCWD, path, a)) return real_unlink(path);
  uint64_t t0 = now_ns();
  int r = real_unlink(path);
  return log_names("unlink", t0, r, errno, 0, a, NULL);
}
int unlinkat(int dirfd, const char* path, int flags) {
  ENSURE(unlinkat);
  char a[PATH_MAX];
  if (!watched(dirfd, path, a)) return real_unlinkat(dirfd, path, flags);
  uint64_t t0 = now_ns();
  int r = real_unlinkat(dirfd, path, flags);
  return log_names((flags & AT_REMOVEDIR) ? "rmdir" : "unlink", t0, r, errno, 0, a, NULL);
}
int rmdir(const char* path) {
  ENSURE(rmdir);
  char a[PATH_MAX];
  if (!watched(AT_FDCWD, path, a)) return real_rmdir(path);
  uint64_t t0 = now_ns();
  int r = real_rmdir(path);
  return log_names("rmdir", t0, r, errno, 0, a, NULL);
}
/* remove() calls unlink or rmdir inside libc, out of the shim's reach. */
int remove(const char* path) {
  ENSURE(remove);
  char a[PATH_MAX];
  if (!watched(AT_FDCWD, path, a)) return real_remove(path);
  struct stat st;
  int is_dir = lstat(path, &st) == 0 && S_ISDIR(st.st_mode);
  uint64_t t0 = now_ns();
  int r = real_remove(path);
  return log_names(is_dir ? "rmdir" : "unlink", t0, r, errno, 0, a, NULL);
}
int mkdir(const char* path, mode_t mode) {
  ENSURE(mkdir);
  char a[PATH_MAX];
  if (!watched(AT_FDCWD, path, a)) return real_mkdir(path, mode);
  uint64_t t0 = now_ns();
  int r = real_mkdir(path, mode);
  return log_names("mkdir", t0, r, errno, 0, a, NULL);
}
int mkdirat(int dirfd, const char* path, mode_t mode) {
  ENSURE(mkdirat);
  char a[PATH_MAX];
  if (!watched(dirfd, path, a)) return real_mkdirat(dirfd, path, mode);
  uint64_t t0 = now_ns();
  int r = real_mkdirat(dirfd, path, mode);
  return log_names("mkdir", t0, r, errno, 0, a, NULL);
}

/* ---- what the explorer cannot model: refused if it touches the root ---- */

int link(const char* a, const char* b) {
  ENSURE(link);
  char x[PATH_MAX];
  if (watched(AT_FDCWD, a, x) || watched(AT_FDCWD, b, x)) log_unsupported("link", x);
  return real_link(a, b);
}
int linkat(int d1, const char* a, int d2, const char* b, int flags) {
  ENSURE(linkat);
  char x[PATH_MAX];
  if (watched(d1, a, x) || watched(d2, b, x)) log_unsupported("link", x);
  return real_linkat(d1, a, d2, b, flags);
}
int symlink(const char* target, const char* path) {
  ENSURE(symlink);
  char x[PATH_MAX];
  if (watched(AT_FDCWD, path, x)) log_unsupported("symlink", x);
  return real_symlink(target, path);
}
static void check_stream(const char* path, const char* mode) {
  char x[PATH_MAX];
  if (mode && strpbrk(mode, "wa+") && watched(AT_FDCWD, path, x)) log_unsupported("fopen", x);
}
FILE* fopen(const char* path, const char* mode) {
  ENSURE(fopen);
  check_stream(path, mode);
  return real_fopen(path, mode);
}
FILE* fopen64(const char* path, const char* mode) {
  ENSURE(fopen64);
  check_stream(path, mode);
  return real_fopen64(path, mode);
}
int aio_write(struct aiocb* cb) {
  ENSURE(aio_write);
  if (fd_watched(cb->aio_fildes)) log_unsupported("aio_write", "");
  return real_aio_write(cb);
}
ssize_t copy_file_range(int in, loff_t* ino, int out, loff_t* outo, size_t n, unsigned int f) {
  ENSURE(copy_file_range);
  if (fd_watched(out)) log_unsupported("copy_file_range", "");
  return real_copy_file_range(in, ino, out, outo, n, f);
}
/* libaio: its iocb is the kernel's (linux/aio_abi.h). */
long io_submit(aio_context_t ctx, long n, struct iocb** cbs) {
  ENSURE(io_submit);
  for (long i = 0; i < n; i++) {
    if (cbs[i] && fd_watched((int)cbs[i]->aio_fildes)) log_unsupported("io_submit", "");
  }
  return real_io_submit(ctx, n, cbs);
}
