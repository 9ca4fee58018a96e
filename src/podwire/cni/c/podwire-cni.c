/*
 * podwire CNI plugin: a pipe between the container runtime and the podwire agent.
 *
 * Forwards the CNI_* environment and stdin (the network config) to the agent's unix socket
 * as {"env": {...}, "stdin": "..."}, then prints the agent's reply ("<exit code>\n<stdout>")
 * and exits with that code. Answers VERSION itself; when the agent is unreachable prints a
 * CNI error: code 50 for STATUS, 11 (try again) otherwise. Built by scripts/setup with gcc.
 *
 * Limits and bytes (the agent applies the same, agent/cni/request.py and agent/cni/socket_proto.py): stdin may hold
 * at most 1 MiB for ADD, 1 MiB + 256 KiB for the other commands (a runtime adds prevResult to
 * the ADD config for DEL and CHECK, and GC lists every valid attachment); more is refused with
 * code 6 before anything is sent. stdin and the CNI_* values must be UTF-8 (JSON text is
 * UTF-8): invalid bytes are refused (6 for stdin, 4 for the environment) instead of being
 * altered. Quotes, backslashes and control bytes are escaped; other UTF-8 passes unchanged.
 * An agent that closes early (over its limit, stopping) never kills the plugin by SIGPIPE:
 * what the agent answered is printed, or a CNI error when it answered nothing.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define MAX_CONFIG (1 << 20)
#define MAX_CONFIG_EXTRA (256 << 10)
#define DEFAULT_SOCKET "/run/podwire/agent.sock"

static const char *ENV_KEYS[] = {"CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS",
                                 "CNI_IFNAME",  "CNI_ARGS",        "CNI_PATH"};

struct buf {
    char *data;
    size_t len, cap;
};

static void put(struct buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (b->len + n + 1 > cap) cap *= 2;
        char *grown = realloc(b->data, cap);
        if (!grown) {
            fputs("{\"cniVersion\":\"1.1.0\",\"code\":5,\"msg\":\"podwire-cni: out of memory\"}",
                  stdout);
            exit(5);
        }
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}

static void puts_raw(struct buf *b, const char *s) { put(b, s, strlen(s)); }

/* JSON string body: quotes, backslashes and control bytes escaped; other bytes (UTF-8, checked
 * by utf8_error) as they are. */
static void put_escaped(struct buf *b, const char *s, size_t n) {
    static const char SHORT[] = {['\b'] = 'b', ['\f'] = 'f', ['\n'] = 'n', ['\r'] = 'r', ['\t'] = 't'};
    char tmp[8];
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            tmp[0] = '\\';
            tmp[1] = (char)c;
            put(b, tmp, 2);
        } else if (c < sizeof SHORT && SHORT[c]) {
            tmp[0] = '\\';
            tmp[1] = SHORT[c];
            put(b, tmp, 2);
        } else if (c < 0x20 || c == 0x7f) {
            snprintf(tmp, sizeof tmp, "\\u%04x", c);
            put(b, tmp, 6);
        } else {
            put(b, (const char *)&s[i], 1);
        }
    }
}

/* Offset of the first byte that is not well-formed UTF-8 (RFC 3629: no overlongs, no
 * surrogates, nothing above U+10FFFF), or -1 when all of it is. */
static long utf8_error(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        size_t len;
        unsigned lo = 0x80, hi = 0xbf;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xc2 && c <= 0xdf) {
            len = 2;
        } else if (c >= 0xe0 && c <= 0xef) {
            len = 3;
            if (c == 0xe0) lo = 0xa0;
            if (c == 0xed) hi = 0x9f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            len = 4;
            if (c == 0xf0) lo = 0x90;
            if (c == 0xf4) hi = 0x8f;
        } else {
            return (long)i;
        }
        if (i + len > n || s[i + 1] < lo || s[i + 1] > hi) return (long)i;
        for (size_t k = 2; k < len; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xbf) return (long)i;
        i += len;
    }
    return -1;
}

#define AGENT_HINT "is the node's podwire agent running on that socket?"

static int fail(int code, const char *msg, const char *detail) {
    struct buf out = {0};
    puts_raw(&out, "{\"cniVersion\":\"1.1.0\",\"code\":");
    char num[16];
    snprintf(num, sizeof num, "%d", code);
    puts_raw(&out, num);
    puts_raw(&out, ",\"msg\":\"");
    put_escaped(&out, msg, strlen(msg));
    if (detail) {
        puts_raw(&out, ": ");
        put_escaped(&out, detail, strlen(detail));
    }
    puts_raw(&out, "\"}");
    fwrite(out.data, 1, out.len, stdout);
    return code;
}

/* The agentSocket value of the config, if it is a plain string; else $PODWIRE_CNI_SOCKET,
 * else the default (a config too broken to name its socket still reaches the agent, which
 * then explains what is wrong with it). */
static void socket_path(const char *config, char *path, size_t size) {
    const char *key = strstr(config, "\"agentSocket\"");
    const char *fallback = getenv("PODWIRE_CNI_SOCKET");
    snprintf(path, size, "%s", fallback && *fallback ? fallback : DEFAULT_SOCKET);
    if (!key) return;
    const char *p = key + strlen("\"agentSocket\"");
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    if (*p++ != ':') return;
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    if (*p++ != '"') return;
    const char *end = strchr(p, '"');
    if (!end || (size_t)(end - p) >= size || memchr(p, '\\', (size_t)(end - p))) return;
    memcpy(path, p, (size_t)(end - p));
    path[end - p] = 0;
}

/* MSG_NOSIGNAL: an agent that closed early is an error to report, not a reason to die. */
static int write_all(int fd, const char *data, size_t len) {
    while (len) {
        ssize_t n = send(fd, data, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        data += n;
        len -= (size_t)n;
    }
    return 0;
}

/* The agent's reply, "<code>\n<stdout>": prints the stdout and returns the code, or -1. */
static int relay(const struct buf *reply) {
    char *newline = memchr(reply->data, '\n', reply->len);
    if (!newline || newline == reply->data) return -1;
    int code = 0;
    for (char *p = reply->data; p < newline; p++) {
        if (*p < '0' || *p > '9' || code > 1000) return -1;
        code = code * 10 + (*p - '0');
    }
    size_t body = reply->len - (size_t)(newline + 1 - reply->data);
    fwrite(newline + 1, 1, body, stdout);
    return code;
}

static int read_all(int fd, struct buf *out) {
    char chunk[65536];
    ssize_t got;
    put(out, "", 0);
    while ((got = read(fd, chunk, sizeof chunk)) != 0) {
        if (got < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        put(out, chunk, (size_t)got);
    }
    return 0;
}

int main(void) {
    signal(SIGPIPE, SIG_IGN); /* stdout too: a runtime that stopped reading must not kill us */
    const char *command = getenv("CNI_COMMAND");
    if (command && strcmp(command, "VERSION") == 0) {
        fputs("{\"cniVersion\":\"1.1.0\",\"supportedVersions\":[\"0.4.0\",\"1.0.0\",\"1.1.0\"]}",
              stdout);
        return 0;
    }
    int unavailable = (command && strcmp(command, "STATUS") == 0) ? 50 : 11;
    int is_del = command && strcmp(command, "DEL") == 0;

    size_t limit = MAX_CONFIG + ((command && strcmp(command, "ADD") == 0) ? 0 : MAX_CONFIG_EXTRA);
    struct buf config = {0};
    char chunk[65536];
    size_t n;
    put(&config, "", 0);
    while ((n = fread(chunk, 1, sizeof chunk, stdin)) > 0) {
        if (config.len + n > limit) {
            char detail[64];
            snprintf(detail, sizeof detail, "more than %zu bytes", limit);
            return fail(6, "network config on stdin is too large", detail);
        }
        put(&config, chunk, n);
    }
    long bad = utf8_error((const unsigned char *)config.data, config.len);
    if (bad >= 0) {
        char detail[64];
        snprintf(detail, sizeof detail, "invalid byte at offset %ld", bad);
        return fail(6, "network config on stdin is not valid UTF-8", detail);
    }

    struct buf req = {0};
    puts_raw(&req, "{\"env\":{");
    int first = 1;
    for (size_t i = 0; i < sizeof ENV_KEYS / sizeof *ENV_KEYS; i++) {
        const char *value = getenv(ENV_KEYS[i]);
        if (!value) continue;
        if (utf8_error((const unsigned char *)value, strlen(value)) >= 0) {
            /* DEL must succeed whatever its netns (the agent ignores it there): drop it. */
            if (is_del && strcmp(ENV_KEYS[i], "CNI_NETNS") == 0) continue;
            return fail(4, "environment variable is not valid UTF-8", ENV_KEYS[i]);
        }
        puts_raw(&req, first ? "\"" : ",\"");
        puts_raw(&req, ENV_KEYS[i]);
        puts_raw(&req, "\":\"");
        put_escaped(&req, value, strlen(value));
        puts_raw(&req, "\"");
        first = 0;
    }
    puts_raw(&req, "},\"stdin\":\"");
    put_escaped(&req, config.data, config.len);
    puts_raw(&req, "\"}");

    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    socket_path(config.data, addr.sun_path, sizeof addr.sun_path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        /* The socket's path and why connect failed: no such file (the agent is not running, or
         * agentSocket names another path) or connection refused (a stale socket). */
        char msg[sizeof addr.sun_path + 160];
        snprintf(msg, sizeof msg, "podwire agent not reachable at %s: %s (%s)", addr.sun_path,
                 strerror(errno), AGENT_HINT);
        return fail(unavailable, msg, NULL);
    }
    /* A failed send is not the end: an agent that refused the request early (too large) has
     * usually answered before closing, and its answer says what is wrong. */
    int sent = write_all(fd, req.data, req.len) == 0 && shutdown(fd, SHUT_WR) == 0;
    int send_errno = errno;
    struct buf reply = {0};
    int got = read_all(fd, &reply);
    int read_errno = errno;
    close(fd);
    if (reply.len) {
        int code = relay(&reply);
        if (code >= 0) return code;
        return fail(unavailable, "podwire agent sent no valid reply", addr.sun_path);
    }
    if (!sent)
        return fail(unavailable, "podwire agent closed the connection before reading the request",
                    strerror(send_errno));
    if (got != 0) return fail(unavailable, "podwire agent connection failed", strerror(read_errno));
    return fail(unavailable, "podwire agent sent no valid reply", addr.sun_path);
}
