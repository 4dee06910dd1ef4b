// An LD_PRELOAD shim for tests/kill_every_file_op.sh: counts the file operations that make a
// write durable or visible (fsync, fdatasync, rename, link, symlink, unlink, remove, mkdir,
// rmdir) on paths under GRAFT_FILEOP_DIR, and kills the process with SIGKILL just before the
// GRAFT_FILEOP_KILL-th of them (1-based). With GRAFT_FILEOP_LOG set it appends "N op path" per
// counted operation to that file, so a test can list the moments to kill at.
#define _GNU_SOURCE
#include <dlfcn.h>
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

static void before(const char* op, const char* path) {
  const char* dir = getenv("GRAFT_FILEOP_DIR");
  if (!dir || !*dir || !strstr(path, dir)) return;
  const long n = ++counted;
  const char* log = getenv("GRAFT_FILEOP_LOG");
  if (log && *log) {
    FILE* f = fopen(log, "a");
    if (f) {
      fprintf(f, "%ld %s %s\n", n, op, path);
      fclose(f);
    }
  }
  const char* kill_at = getenv("GRAFT_FILEOP_KILL");
  if (kill_at && atol(kill_at) == n) raise(SIGKILL);
}

#define REAL(ret, name, ...) \
  static ret (*real)(__VA_ARGS__); \
  if (!real) real = (ret(*)(__VA_ARGS__))dlsym(RTLD_NEXT, name)

static void path_op(const char* op, const char* p) {
  char buf[PATH_MAX + 64];
  before(op, full_path(p, buf, sizeof buf));
}

static void fd_op(const char* op, int fd) {
  char buf[PATH_MAX];
  before(op, fd_path(fd, buf, sizeof buf));
}

int fsync(int fd) {
  REAL(int, "fsync", int);
  fd_op("fsync", fd);
  return real(fd);
}
int fdatasync(int fd) {
  REAL(int, "fdatasync", int);
  fd_op("fdatasync", fd);
  return real(fd);
}
int rename(const char* a, const char* b) {
  REAL(int, "rename", const char*, const char*);
  path_op("rename", b);
  return real(a, b);
}
int renameat(int da, const char* a, int db, const char* b) {
  REAL(int, "renameat", int, const char*, int, const char*);
  path_op("renameat", b);
  return real(da, a, db, b);
}
int link(const char* a, const char* b) {
  REAL(int, "link", const char*, const char*);
  path_op("link", b);
  return real(a, b);
}
int symlink(const char* a, const char* b) {
  REAL(int, "symlink", const char*, const char*);
  path_op("symlink", b);
  return real(a, b);
}
int unlink(const char* p) {
  REAL(int, "unlink", const char*);
  path_op("unlink", p);
  return real(p);
}
int unlinkat(int d, const char* p, int flags) {
  REAL(int, "unlinkat", int, const char*, int);
  path_op("unlinkat", p);
  return real(d, p, flags);
}
int remove(const char* p) {
  REAL(int, "remove", const char*);
  path_op("remove", p);
  return real(p);
}
int mkdir(const char* p, mode_t m) {
  REAL(int, "mkdir", const char*, mode_t);
  path_op("mkdir", p);
  return real(p, m);
}
int rmdir(const char* p) {
  REAL(int, "rmdir", const char*);
  path_op("rmdir", p);
  return real(p);
}
