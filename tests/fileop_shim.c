// An LD_PRELOAD shim for tests/kill_every_file_op.sh: counts the file operations that make a
// write durable or visible (fsync, fdatasync, rename, link, symlink, unlink, remove, mkdir,
// rmdir) on GRAFT_FILEOP_DIR (an absolute path) and paths under it, and kills the process with
// SIGKILL just before the GRAFT_FILEOP_KILL-th of them (1-based). With GRAFT_FILEOP_LOG set it appends "N op path" per
// counted operation to that file, so a test can list the moments to kill at.
//
// GRAFT_FILEOP_FAIL=N makes the N-th counted operation fail instead: it returns -1 (EOF for
// fflush and fclose) with errno GRAFT_FILEOP_ERRNO (EIO, the default, or ENOSPC) without doing
// it, as a full or failing disk would. GRAFT_FILEOP_MORE=1 also counts the operations a write
// fails at besides those: open with O_CREAT, and fflush and fclose of a stream (an fclose that
// fails still closes it, as fclose does).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static long counted;
static int logging;

static const char* fd_path(int fd, char* buf, size_t n) {
  char link[64];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t len = readlink(link, buf, n - 1);
  buf[len < 0 ? 0 : len] = 0;
  return buf;
}

// An absolute path for a relative one, so the GRAFT_FILEOP_DIR test sees where it points.
static const char* full_path(const char* p, char* buf, size_t n) {
  if (p[0] == '/') return p;
  char cwd[PATH_MAX];
  if (!getcwd(cwd, sizeof cwd)) return p;
  snprintf(buf, n, "%s/%s", cwd, p);
  return buf;
}

// Whether the operation about to run is the one to fail (errno is then set).
static int before(const char* op, const char* path) {
  const char* dir = getenv("GRAFT_FILEOP_DIR");
  if (!dir || !*dir) return 0;
  const size_t len = strlen(dir);  // dir itself or what is under it, not "<dir>.log"
  if (strncmp(path, dir, len) != 0 || (path[len] != 0 && path[len] != '/')) return 0;
  if (logging) return 0;  // the log's own fclose is not the run's
  const long n = ++counted;
  const char* log = getenv("GRAFT_FILEOP_LOG");
  if (log && *log) {
    logging = 1;
    FILE* f = fopen(log, "a");
    if (f) {
      fprintf(f, "%ld %s %s\n", n, op, path);
      fclose(f);
    }
    logging = 0;
  }
  const char* kill_at = getenv("GRAFT_FILEOP_KILL");
  if (kill_at && atol(kill_at) == n) raise(SIGKILL);
  const char* fail_at = getenv("GRAFT_FILEOP_FAIL");
  if (!fail_at || atol(fail_at) != n) return 0;
  const char* err = getenv("GRAFT_FILEOP_ERRNO");
  errno = err && strcmp(err, "ENOSPC") == 0 ? ENOSPC : EIO;
  return 1;
}

static int more(void) {
  const char* m = getenv("GRAFT_FILEOP_MORE");
  return m && *m == '1';
}

#define REAL(ret, name, ...) \
  static ret (*real)(__VA_ARGS__); \
  if (!real) real = (ret(*)(__VA_ARGS__))dlsym(RTLD_NEXT, name)

static int path_op(const char* op, const char* p) {
  char buf[PATH_MAX + 64];
  return before(op, full_path(p, buf, sizeof buf));
}

static int fd_op(const char* op, int fd) {
  char buf[PATH_MAX];
  return before(op, fd_path(fd, buf, sizeof buf));
}

int fsync(int fd) {
  REAL(int, "fsync", int);
  if (fd_op("fsync", fd)) return -1;
  return real(fd);
}
int fdatasync(int fd) {
  REAL(int, "fdatasync", int);
  if (fd_op("fdatasync", fd)) return -1;
  return real(fd);
}
int rename(const char* a, const char* b) {
  REAL(int, "rename", const char*, const char*);
  if (path_op("rename", b)) return -1;
  return real(a, b);
}
int renameat(int da, const char* a, int db, const char* b) {
  REAL(int, "renameat", int, const char*, int, const char*);
  if (path_op("renameat", b)) return -1;
  return real(da, a, db, b);
}
int link(const char* a, const char* b) {
  REAL(int, "link", const char*, const char*);
  if (path_op("link", b)) return -1;
  return real(a, b);
}
int symlink(const char* a, const char* b) {
  REAL(int, "symlink", const char*, const char*);
  if (path_op("symlink", b)) return -1;
  return real(a, b);
}
int unlink(const char* p) {
  REAL(int, "unlink", const char*);
  if (path_op("unlink", p)) return -1;
  return real(p);
}
int unlinkat(int d, const char* p, int flags) {
  REAL(int, "unlinkat", int, const char*, int);
  if (path_op("unlinkat", p)) return -1;
  return real(d, p, flags);
}
int remove(const char* p) {
  REAL(int, "remove", const char*);
  if (path_op("remove", p)) return -1;
  return real(p);
}
int mkdir(const char* p, mode_t m) {
  REAL(int, "mkdir", const char*, mode_t);
  if (path_op("mkdir", p)) return -1;
  return real(p, m);
}
int rmdir(const char* p) {
  REAL(int, "rmdir", const char*);
  if (path_op("rmdir", p)) return -1;
  return real(p);
}

// Whether open's third argument is there (glibc's __OPEN_NEEDS_MODE): O_TMPFILE holds
// O_DIRECTORY's bit, so testing its bits alone would read a mode a directory open never passed.
static int needs_mode(int flags) { return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE; }

// Counted with GRAFT_FILEOP_MORE=1 only.
static int open_op(const char* p, int flags) {
  return more() && (flags & O_CREAT) && path_op("open", p);
}
// open and open64 alike: the mode read only where the call passed one, then the operation
// counted (and, when its turn comes, failed).
#define OPEN_WRAPPER(name)                     \
  int name(const char* p, int flags, ...) {    \
    REAL(int, #name, const char*, int, ...);   \
    mode_t m = 0;                              \
    if (needs_mode(flags)) {                   \
      va_list ap;                              \
      va_start(ap, flags);                     \
      m = va_arg(ap, mode_t);                  \
      va_end(ap);                              \
    }                                          \
    if (open_op(p, flags)) return -1;          \
    return real(p, flags, m);                  \
  }
OPEN_WRAPPER(open)
OPEN_WRAPPER(open64)
int fflush(FILE* f) {
  REAL(int, "fflush", FILE*);
  if (f && more() && fd_op("fflush", fileno(f))) return EOF;
  return real(f);
}
int fclose(FILE* f) {
  REAL(int, "fclose", FILE*);
  if (more() && fd_op("fclose", fileno(f))) {
    const int err = errno;
    real(f);
    errno = err;
    return EOF;
  }
  return real(f);
}
