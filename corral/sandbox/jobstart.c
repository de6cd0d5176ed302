/* corral's job starter, compiled (corral/sandbox/starter.py; decision 0055).
 *
 * The two steps of a contained Slurm job's batch script that were Python starts, each a
 * process of its own before the work, doing what its Python twin does:
 *
 *   jobstart opendir FD PATH UID GID GROUPS -- ARGV...   (corral/sandbox/opendir.py main)
 *     opens PATH one component at a time without following a link (O_PATH|O_NOFOLLOW),
 *     as UID/GID/GROUPS when root runs it (UID -1: as itself), at descriptor FD, then
 *     execs ARGV (bwrap, which binds the descriptor);
 *   jobstart apply HEX ENVFD ARGV...                     (corral/sandbox/seccomp.py APPLY)
 *     takes the job's environment from ENVFD (a JSON object of strings; "-": none) over
 *     the one it was started with, installs the BPF program HEX ("-": none) as its
 *     seccomp filter, then execs ARGV, found on the job's own PATH.
 *
 * The filter is the very program the gateway made with libseccomp, passed as the same hex
 * the Python step reads: nothing of it is compiled in. Run as /dev/fd/N (the batch script
 * opened it there, so a job whose sandbox hides corral's install still reaches it), the
 * apply step closes N before the job: the job holds nothing of corral's.
 *
 * Why C: each Python start cost 30-60 ms of Slurm's start-to-end on a busy node
 * (bench/batch_overhead.py); this costs about a millisecond.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static void die(int code, const char *fmt, const char *a, const char *b, const char *c) {
    fprintf(stderr, fmt, a, b, c);
    _exit(code);
}

static long number(const char *s, const char *what) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end)
        die(2, "corral: jobstart: %s is not a number: %s%s\n", what, s, "");
    return v;
}

/* opendir.walk: "/" then each component but "" and "." (".." is walked, as there). */
static int walk(const char *path) {
    int fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    char *copy = strdup(path), *save = NULL;
    for (char *part = strtok_r(copy, "/", &save); part; part = strtok_r(NULL, "/", &save)) {
        if (strcmp(part, ".") == 0)
            continue;
        int nxt = openat(fd, part, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        int err = errno;
        close(fd);
        if (nxt < 0) {
            free(copy);
            errno = err;
            return -1;
        }
        fd = nxt;
    }
    free(copy);
    return fd;
}

/* opendir._walk_as: a child that becomes the job's identity walks; it shares this
 * process's descriptor table (CLONE_FILES), so what it opens is ours. -> errno, 0: opened. */
static int walk_as(const char *path, int at, uid_t uid, gid_t gid, char *groups) {
    gid_t list[1024];
    size_t n = 0;
    for (char *save = NULL, *g = strtok_r(groups, ",", &save); g; g = strtok_r(NULL, ",", &save)) {
        if (n == sizeof list / sizeof *list)
            die(2, "corral: jobstart: too many groups%s%s%s\n", "", "", "");
        list[n++] = (gid_t)number(g, "a group");
    }
    pid_t pid = (pid_t)syscall(SYS_clone, CLONE_FILES | SIGCHLD, 0, 0, 0, 0);
    if (pid < 0)
        return errno;
    if (pid == 0) {
        if (setgroups(n, list) || setresgid(gid, gid, gid) || setresuid(uid, uid, uid))
            _exit(errno & 0xff);
        int fd = walk(path);
        if (fd < 0)
            _exit(errno & 0xff);
        if (fd != at && dup2(fd, at) < 0)  /* dup2 clears close-on-exec: bwrap inherits it */
            _exit(errno & 0xff);
        if (fd == at)
            fcntl(fd, F_SETFD, 0);
        else
            close(fd);
        _exit(0);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return errno;
    if (!WIFEXITED(status))
        return EIO;
    return WEXITSTATUS(status);
}

static int open_here(const char *path, int at) {
    int fd = walk(path);
    if (fd < 0)
        return errno;
    if (fd != at) {
        if (dup2(fd, at) < 0)
            return errno;
        close(fd);
    } else {
        fcntl(fd, F_SETFD, 0);
    }
    return 0;
}

static int do_opendir(int argc, char **argv) {
    if (argc < 8 || strcmp(argv[6], "--") != 0)
        die(2, "corral: jobstart opendir FD PATH UID GID GROUPS -- ARGV...%s%s%s\n", "", "", "");
    int at = (int)number(argv[1], "the descriptor");
    const char *path = argv[2];
    long uid = number(argv[3], "the uid"), gid = number(argv[4], "the gid");
    int err = (uid < 0 || geteuid() != 0 || uid == 0) ? open_here(path, at)
                                                       : walk_as(path, at, (uid_t)uid, (gid_t)gid, argv[5]);
    if (err == EACCES || err == EPERM)
        die(125, "corral: its working directory %s is not reachable by the identity it runs as (%s): a parent is "
            "closed to it; pick a directory it may enter%s\n", path, strerror(err), "");
    if (err)
        die(125, "corral: its working directory %s cannot be opened without following a link (%s): it changed since "
            "it was checked; submit it again with a directory that is not a link and whose parents are not links%s\n",
            path, strerror(err), "");
    execvp(argv[7], argv + 7);
    die(127, "corral: could not start %s: %s%s\n", argv[7], strerror(errno), "");
    return 127;
}

/* ---- the job's environment: a JSON object of strings (json.dumps of a dict) ---- */

static const char *p, *lim;

static void bad(const char *why) { die(126, "corral: the job's environment could not be read (%s)%s%s\n", why, "", ""); }

static void ws(void) {
    while (p < lim && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
}

static unsigned hex4(void) {
    if (lim - p < 4)
        bad("a short \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; i++, p++) {
        char c = *p;
        v = v * 16 + (unsigned)(c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                : c >= 'A' && c <= 'F' ? c - 'A' + 10 : (bad("a bad \\u escape"), 0));
    }
    return v;
}

static char *put_utf8(char *o, unsigned cp) {
    if (cp < 0x80) { *o++ = (char)cp; }
    else if (cp < 0x800) { *o++ = (char)(0xc0 | cp >> 6); *o++ = (char)(0x80 | (cp & 0x3f)); }
    else if (cp < 0x10000) { *o++ = (char)(0xe0 | cp >> 12); *o++ = (char)(0x80 | (cp >> 6 & 0x3f));
                             *o++ = (char)(0x80 | (cp & 0x3f)); }
    else { *o++ = (char)(0xf0 | cp >> 18); *o++ = (char)(0x80 | (cp >> 12 & 0x3f));
           *o++ = (char)(0x80 | (cp >> 6 & 0x3f)); *o++ = (char)(0x80 | (cp & 0x3f)); }
    return o;
}

/* A JSON string at p into o (NUL-terminated; never longer than its source). -> past its end. */
static char *string(char *o) {
    if (p >= lim || *p++ != '"')
        bad("a string was expected");
    for (;;) {
        if (p >= lim)
            bad("an unterminated string");
        unsigned char c = (unsigned char)*p++;
        if (c == '"')
            break;
        if (c < 0x20)
            bad("a control character in a string");
        if (c != '\\') { *o++ = (char)c; continue; }
        if (p >= lim)
            bad("an unterminated string");
        switch (*p++) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '/': *o++ = '/'; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u': {
            unsigned cp = hex4();
            if (cp >= 0xd800 && cp < 0xdc00) {  /* a pair, as json's scanner joins it */
                if (lim - p < 6 || p[0] != '\\' || p[1] != 'u')
                    bad("a lone surrogate");
                p += 2;
                unsigned lo = hex4();
                if (lo < 0xdc00 || lo >= 0xe000)
                    bad("a lone surrogate");
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            } else if (cp >= 0xdc00 && cp < 0xe000) {
                bad("a lone surrogate");
            }
            if (cp == 0)
                bad("a NUL in a string");
            o = put_utf8(o, cp);
            break;
        }
        default: bad("a bad escape");
        }
    }
    *o = 0;
    return o + 1;
}

/* environ with each KEY of the object at fd over its own (a later duplicate wins). */
static char **job_env(int fd) {
    size_t cap = 1 << 22, got = 0;  /* what APPLY reads: 4 MiB at most */
    char *text = malloc(cap + 1);
    for (ssize_t r; got < cap && (r = read(fd, text + got, cap - got)) != 0;) {
        if (r < 0) {
            if (errno == EINTR)
                continue;
            bad(strerror(errno));
        }
        got += (size_t)r;
    }
    close(fd);
    p = text, lim = text + got;
    size_t n = 0, max = 16;
    for (char **e = environ; *e; e++)
        max++;
    for (const char *q = p; q < lim; q++)
        max += *q == ':';  /* one pair per ':' at most */
    char **env = calloc(max + 1, sizeof *env), *out = malloc(2 * got + 2), *o = out;
    for (char **e = environ; *e; e++)
        env[n++] = *e;
    ws();
    if (p >= lim || *p++ != '{')
        bad("an object was expected");
    ws();
    if (p < lim && *p == '}') {
        p++;
    } else {
        for (;;) {
            ws();
            char *key = o;
            o = string(o);
            size_t klen = strlen(key);
            if (!klen || strchr(key, '='))
                bad("a variable's name is empty or holds '='");
            ws();
            if (p >= lim || *p++ != ':')
                bad("':' was expected");
            ws();
            o[-1] = '=';  /* KEY=VALUE, one string */
            o = string(o);
            size_t i = 0;
            while (i < n && !(strncmp(env[i], key, klen) == 0 && env[i][klen] == '='))
                i++;
            env[i] = key;
            if (i == n)
                n++;
            ws();
            if (p < lim && *p == ',') { p++; continue; }
            if (p < lim && *p == '}') { p++; break; }
            bad("',' or '}' was expected");
        }
    }
    ws();
    if (p != lim)
        bad("trailing data");
    env[n] = NULL;
    return env;
}

static int do_apply(int argc, char **argv, const char *self) {
    if (argc < 4)
        die(2, "corral: jobstart apply HEX ENVFD ARGV...%s%s%s\n", "", "", "");
    if (strcmp(argv[2], "-") != 0)
        environ = job_env((int)number(argv[2], "the environment's descriptor"));
    if (strncmp(self, "/dev/fd/", 8) == 0)  /* started through the script's descriptor: not the job's */
        close((int)number(self + 8, "the starter's descriptor"));
    const char *hex = argv[1];
    size_t len = strcmp(hex, "-") ? strlen(hex) / 2 : 0;
    if (len) {
        if (strlen(hex) % 2 || len % sizeof(struct sock_filter))
            die(126, "corral: the sandbox's system-call filter is not a BPF program%s%s%s\n", "", "", "");
        unsigned char *b = malloc(len);
        for (size_t i = 0; i < len; i++) {
            unsigned v;
            if (sscanf(hex + 2 * i, "%2x", &v) != 1)
                die(126, "corral: the sandbox's system-call filter is not a BPF program%s%s%s\n", "", "", "");
            b[i] = (unsigned char)v;
        }
        struct sock_fprog prog = {(unsigned short)(len / sizeof(struct sock_filter)), (struct sock_filter *)b};
        prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
        if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) != 0) {
            fprintf(stderr, "corral: the sandbox's system-call filter could not be installed (errno %d)\n", errno);
            _exit(126);
        }
    }
    execvp(argv[3], argv + 3);  /* searched on the job's PATH, as os.execvpe does */
    die(127, "corral: could not start %s: %s%s\n", argv[3], strerror(errno), "");
    return 127;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "opendir") == 0)
        return do_opendir(argc - 1, argv + 1);
    if (argc > 1 && strcmp(argv[1], "apply") == 0)
        return do_apply(argc - 1, argv + 1, argv[0]);
    fprintf(stderr, "corral: jobstart opendir|apply ...\n");
    return 2;
}
