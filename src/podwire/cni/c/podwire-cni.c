/*
 * podwire CNI plugin: a pipe between the container runtime and the podwire agent.
 *
 * Forwards the CNI_* environment and stdin (the network config) to the agent's unix socket
 * as {"env": {...}, "stdin": "..."}, then prints the agent's reply ("<exit code>\n<stdout>")
 * and exits with that code. Answers VERSION itself; when the agent is unreachable prints a
 * CNI error: code 50 for STATUS, 11 (try again) otherwise. Built by scripts/setup with gcc.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define MAX_INPUT (1 << 20)
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
        if (!grown) exit(5);
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}

static void puts_raw(struct buf *b, const char *s) { put(b, s, strlen(s)); }

/* JSON string body: quotes, backslashes and control bytes escaped; other bytes as they are. */
static void put_escaped(struct buf *b, const char *s, size_t n) {
    char tmp[8];
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            tmp[0] = '\\';
            tmp[1] = (char)c;
            put(b, tmp, 2);
        } else if (c < 0x20) {
            snprintf(tmp, sizeof tmp, "\\u%04x", c);
            put(b, tmp, 6);
        } else {
            put(b, (const char *)&s[i], 1);
        }
    }
}

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

static int write_all(int fd, const char *data, size_t len) {
    while (len) {
        ssize_t n = write(fd, data, len);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        data += n;
        len -= (size_t)n;
    }
    return 0;
}

int main(void) {
    const char *command = getenv("CNI_COMMAND");
    if (command && strcmp(command, "VERSION") == 0) {
        fputs("{\"cniVersion\":\"1.1.0\",\"supportedVersions\":[\"0.4.0\",\"1.0.0\",\"1.1.0\"]}",
              stdout);
        return 0;
    }
    int unavailable = (command && strcmp(command, "STATUS") == 0) ? 50 : 11;

    struct buf config = {0};
    char chunk[65536];
    size_t n;
    put(&config, "", 0);
    while ((n = fread(chunk, 1, sizeof chunk, stdin)) > 0) {
        if (config.len + n > MAX_INPUT) return fail(6, "network config on stdin is larger than 1 MiB", NULL);
        put(&config, chunk, n);
    }

    struct buf req = {0};
    puts_raw(&req, "{\"env\":{");
    int first = 1;
    for (size_t i = 0; i < sizeof ENV_KEYS / sizeof *ENV_KEYS; i++) {
        const char *value = getenv(ENV_KEYS[i]);
        if (!value) continue;
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
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0)
        return fail(unavailable, "podwire agent not reachable", addr.sun_path);
    if (write_all(fd, req.data, req.len) != 0 || shutdown(fd, SHUT_WR) != 0)
        return fail(unavailable, "podwire agent closed the connection", addr.sun_path);

    struct buf reply = {0};
    ssize_t got;
    put(&reply, "", 0);
    while ((got = read(fd, chunk, sizeof chunk)) != 0) {
        if (got < 0) {
            if (errno == EINTR) continue;
            return fail(unavailable, "podwire agent connection failed", strerror(errno));
        }
        put(&reply, chunk, (size_t)got);
    }
    close(fd);

    char *newline = memchr(reply.data, '\n', reply.len);
    if (!newline || newline == reply.data)
        return fail(unavailable, "podwire agent sent no valid reply", addr.sun_path);
    int code = 0;
    for (char *p = reply.data; p < newline; p++) {
        if (*p < '0' || *p > '9' || code > 1000)
            return fail(unavailable, "podwire agent sent no valid reply", addr.sun_path);
        code = code * 10 + (*p - '0');
    }
    size_t body = reply.len - (size_t)(newline + 1 - reply.data);
    fwrite(newline + 1, 1, body, stdout);
    return code;
}
