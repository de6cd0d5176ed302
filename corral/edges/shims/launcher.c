/* corral's Slurm shim launcher, compiled (corral/edges/shims/helper.py; decision 0013).
 *
 * Every shim (sbatch, squeue ...) of an agent session is this program under the command's
 * name. It hands the session's resident helper ($CORRAL_SHIM_SOCKET) its working
 * directory, name, arguments and environment, and its stdin/stdout/stderr (SCM_RIGHTS),
 * then exits with the one byte the helper sends back: the protocol of helper.py's Python
 * launcher, byte for byte. Without the helper it runs the shim in Python, as that
 * launcher does (CORRAL_PYTHON and CORRAL_ROOT are given when it is compiled).
 *
 * Why C: the CPU of a call on the login node. Python's own start is about twice
 * Slurm's squeue; this costs well under a millisecond (bench/shim_cost.py).
 */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#ifndef CORRAL_PYTHON
#error "compile with -DCORRAL_PYTHON='\"/path/to/python\"'"
#endif
#ifndef CORRAL_ROOT
#error "compile with -DCORRAL_ROOT='\"/path/to/checkout\"'"
#endif

extern char **environ;

static char *buf;
static size_t len, cap;

static int put(const char *s, size_t n, int sep) {
    if (len + n + 1 > cap) {
        size_t want = (len + n + 1) * 2;
        char *grown = realloc(buf, want);
        if (!grown) return -1;
        buf = grown;
        cap = want;
    }
    if (sep && len) buf[len++] = '\0';
    memcpy(buf + len, s, n);
    len += n;
    return 0;
}

static void in_python(int argc, char **argv, const char *name) {
    static const char code[] =
        "import sys; sys.path.insert(0, sys.argv.pop(1)); from corral.edges.shims import dispatch; "
        "sys.exit(dispatch(sys.argv[1], sys.argv[2:]))";
    char **av = calloc((size_t)argc + 7, sizeof *av);
    if (!av) exit(1);
    int k = 0;
    av[k++] = CORRAL_PYTHON;
    av[k++] = "-I"; /* isolated: nothing from the caller's directory (others may write it) or PYTHON* */
    av[k++] = "-S";
    av[k++] = "-c";
    av[k++] = (char *)code;
    av[k++] = CORRAL_ROOT;
    av[k++] = (char *)name;
    for (int i = 1; i < argc; i++) av[k++] = argv[i];
    av[k] = NULL;
    execv(CORRAL_PYTHON, av);
    fprintf(stderr, "%s: error: corral's shim could not start %s: %s\n", name, CORRAL_PYTHON, strerror(errno));
    exit(1);
}

int main(int argc, char **argv) {
    const char *name = strrchr(argv[0], '/');
    name = name ? name + 1 : argv[0];
    const char *path = getenv("CORRAL_SHIM_SOCKET");
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (!path || !*path || strlen(path) >= sizeof addr.sun_path) in_python(argc, argv, name);
    strcpy(addr.sun_path, path);

    char cwd[PATH_MAX], count[16];
    if (!getcwd(cwd, sizeof cwd)) in_python(argc, argv, name);
    snprintf(count, sizeof count, "%d", argc - 1);
    if (put(cwd, strlen(cwd), 1) || put(name, strlen(name), 1) || put(count, strlen(count), 1))
        in_python(argc, argv, name);
    for (int i = 1; i < argc; i++)
        if (put(argv[i], strlen(argv[i]), 1)) in_python(argc, argv, name);
    for (char **e = environ; *e; e++)
        if (put(*e, strlen(*e), 1)) in_python(argc, argv, name);

    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0 || connect(s, (struct sockaddr *)&addr, sizeof addr) != 0) in_python(argc, argv, name);

    unsigned char head[8];
    uint64_t n = len;
    for (int i = 7; i >= 0; i--, n >>= 8) head[i] = (unsigned char)(n & 0xff);
    struct iovec iov[2] = {{head, sizeof head}, {buf, len}};
    int fds[3] = {0, 1, 2};
    union {
        char space[CMSG_SPACE(sizeof fds)];
        struct cmsghdr align;
    } control;
    memset(&control, 0, sizeof control);
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 2, .msg_control = control.space,
                         .msg_controllen = sizeof control.space};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof fds);
    memcpy(CMSG_DATA(c), fds, sizeof fds);
    ssize_t sent;
    do sent = sendmsg(s, &msg, MSG_NOSIGNAL); while (sent < 0 && errno == EINTR);
    if (sent < 0) in_python(argc, argv, name); /* e.g. a closed stdin: nothing was sent */
    size_t total = sizeof head + len, done = (size_t)sent;
    while (done < total) { /* the rest of a large environment, without the descriptors */
        const char *from = done < sizeof head ? (const char *)head + done : buf + (done - sizeof head);
        size_t left = done < sizeof head ? sizeof head - done : total - done;
        ssize_t w = send(s, from, left, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return 1;
        done += (size_t)w;
    }
    unsigned char rc;
    ssize_t got;
    do got = read(s, &rc, 1); while (got < 0 && errno == EINTR);
    return got == 1 ? rc : 1;
}
