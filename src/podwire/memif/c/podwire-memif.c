/*
 * podwire-memif: the master (server) side of one pod's memif, and its data path to a tap.
 *
 * The agent binds the grant's control socket and opens the tap on the network's bridge, then
 * runs this program with both descriptors (--listen-fd: the listening SOCK_SEQPACKET socket,
 * --tap-fd: the tap; the secret in the environment, PODWIRE_MEMIF_SECRET).
 * It serves one client at a time: the memif control protocol (hello, init with the secret
 * checked, regions, rings, connect) with every field validated against the limits given on
 * the command line, then copies frames between the client's rings and the tap. It sleeps in
 * epoll between frames: the client's eventfds and the tap wake it (interrupt mode). A client
 * that goes away (CNF restart) leaves it listening for the next one. It is a process of its
 * own so that an agent restart never interrupts a pod's traffic.
 *
 * Everything the client shares (messages, ring indexes, descriptors) is untrusted: a
 * descriptor is copied before it is checked and used, and memory is only touched inside a
 * region whose file cannot shrink (F_SEAL_SHRINK), so a client can neither make this process
 * read or write outside the regions it mapped nor fault it.
 *
 * Written from DPDK's doc/guides/nics/memif.rst description of the wire protocol.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/if_tun.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static int LISTEN_FD = -1;
static int TAP_FD = -1;

#define MSG_SIZE 128
#define NAME_SIZE 32
#define SECRET_SIZE 24
#define VERSION 0x0200
#define COOKIE 0x3E31F20u
#define RING_FLAG_MASK_INT 1
#define DESC_FLAG_NEXT 1
#define ADD_RING_FLAG_C2S 1
#define RING_HEADER 128 /* cookie, flags, head | tail (own cache line) | descriptors */
#define DESC_SIZE 16

enum msg_type {
    T_NONE, T_ACK, T_HELLO, T_INIT, T_ADD_REGION, T_ADD_RING, T_CONNECT, T_CONNECTED,
    T_DISCONNECT, T_COUNT
};

#define HARD_MAX_REGIONS 16
#define HARD_MAX_RINGS 16
#define MAX_FRAME 65535
#define BATCH 256

struct desc {
    uint16_t flags;
    uint16_t region;
    uint32_t length;
    uint32_t offset;
    uint32_t metadata;
};

struct region {
    uint8_t *addr;
    uint64_t size;
};

struct ring {
    uint8_t *base; /* header in the client's region */
    uint16_t size; /* slots; a power of two */
    uint16_t last; /* C2S: next slot to read; S2C: our tail */
    int efd;
};

struct limits {
    unsigned max_regions, max_rings, max_log2_ring;
    uint64_t max_region_bytes;
    unsigned handshake_ms;
    unsigned poll_us;
};

enum state { S_IDLE, S_WAIT_INIT, S_SETUP, S_CONNECTED };

struct conn {
    int fd;
    enum state state;
    long long deadline_ms;
    struct region regions[HARD_MAX_REGIONS];
    unsigned nregions;
    struct ring c2s[HARD_MAX_RINGS], s2c[HARD_MAX_RINGS];
    unsigned nc2s, ns2c;
    uint64_t rx_frames, tx_frames, tx_dropped, rx_bad;
};

static const char *g_name = "memif";
static char g_secret[SECRET_SIZE + 1];
static size_t g_secret_len;
static struct limits g_lim = {1, 2, 14, 1ull << 28, 5000, 0};
static volatile sig_atomic_t g_stop;
static int g_epoll = -1;
static uint8_t g_scratch[MAX_FRAME];

/* -- logging: "event key=value" lines, like the agent's text logs ------------------------ */

static void logline(const char *event, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s name=%s %s\n", event, g_name, buf);
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* -- little-endian field access into a 128-byte message ------------------------------- */

static uint16_t get16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static uint32_t get32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }

static void copy_name(char *out, const uint8_t *field, size_t size)
{
    size_t i;
    for (i = 0; i < size && field[i]; i++)
        out[i] = (field[i] >= 0x20 && field[i] < 0x7f && field[i] != '"') ? (char)field[i] : '?';
    out[i] = 0;
}

/* -- control messages ----------------------------------------------------------------- */

static int send_msg(int fd, const uint8_t *msg)
{
    ssize_t n = send(fd, msg, MSG_SIZE, MSG_NOSIGNAL | MSG_DONTWAIT);
    return n == MSG_SIZE ? 0 : -1;
}

static void send_simple(int fd, uint16_t type)
{
    uint8_t msg[MSG_SIZE] = {0};
    put16(msg, type);
    send_msg(fd, msg);
}

static void send_hello(int fd)
{
    uint8_t msg[MSG_SIZE] = {0};
    put16(msg, T_HELLO);
    strncpy((char *)msg + 2, "podwire", NAME_SIZE - 1);
    put16(msg + 34, VERSION);
    put16(msg + 36, VERSION);
    put16(msg + 38, (uint16_t)(g_lim.max_regions - 1));
    put16(msg + 40, (uint16_t)(g_lim.max_rings - 1)); /* highest S2C ring index */
    put16(msg + 42, (uint16_t)(g_lim.max_rings - 1)); /* highest C2S ring index */
    msg[44] = (uint8_t)g_lim.max_log2_ring;
    send_msg(fd, msg);
}

static void send_disconnect(int fd, const char *reason)
{
    uint8_t msg[MSG_SIZE] = {0};
    put16(msg, T_DISCONNECT);
    put32(msg + 2, 1);
    strncpy((char *)msg + 6, reason, 95);
    send_msg(fd, msg);
}

/* -- connection lifetime -------------------------------------------------------------- */

static void reset_conn(struct conn *c)
{
    unsigned i;
    for (i = 0; i < c->nregions; i++)
        munmap(c->regions[i].addr, c->regions[i].size);
    for (i = 0; i < c->nc2s; i++) {
        epoll_ctl(g_epoll, EPOLL_CTL_DEL, c->c2s[i].efd, NULL);
        close(c->c2s[i].efd);
    }
    for (i = 0; i < c->ns2c; i++)
        close(c->s2c[i].efd);
    if (c->fd >= 0) {
        epoll_ctl(g_epoll, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
    }
    memset(c, 0, sizeof(*c));
    c->fd = -1;
    c->state = S_IDLE;
}

static void set_carrier(int on)
{
#ifdef TUNSETCARRIER
    unsigned int value = on ? 1 : 0;
    ioctl(TAP_FD, TUNSETCARRIER, &value);
#else
    (void)on;
#endif
}

/* Refuse the client: tell it why (memif's disconnect message), log it, keep listening. */
static void refuse(struct conn *c, const char *reason)
{
    logline("memif.refused", "reason=\"%s\" state=%d", reason, (int)c->state);
    send_disconnect(c->fd, reason);
    if (c->state == S_CONNECTED)
        set_carrier(0);
    reset_conn(c);
}

static void closed(struct conn *c, const char *why)
{
    if (c->state == S_CONNECTED) {
        logline("memif.disconnected",
                "reason=\"%s\" rx_frames=%llu tx_frames=%llu tx_dropped=%llu", why,
                (unsigned long long)c->rx_frames, (unsigned long long)c->tx_frames,
                (unsigned long long)c->tx_dropped);
        set_carrier(0);
    } else {
        logline("memif.refused", "reason=\"%s\" state=%d", why, (int)c->state);
    }
    reset_conn(c);
}

/* -- handshake steps; each returns NULL or the reason to refuse ------------------------ */

static const char *on_init(const uint8_t *m)
{
    char received[SECRET_SIZE + 1], peer[NAME_SIZE + 1];
    size_t len, i;
    unsigned char diff = 0;
    int equal;
    if (get16(m + 2) != VERSION)
        return "incompatible memif version (this master speaks 2.0)";
    if (get32(m + 4) != 0)
        return "no interface with this id (only id 0 is served)";
    if (m[8] != 0)
        return "only ethernet mode is supported";
    memcpy(received, m + 9, SECRET_SIZE);
    received[SECRET_SIZE] = 0;
    len = strlen(received);
    /* A C client sends the secret as a string in the 24-byte field, so a 24-character secret
     * arrives as its first 23 characters; both forms are accepted. */
    equal = len == g_secret_len || (g_secret_len == SECRET_SIZE && len == SECRET_SIZE - 1);
    for (i = 0; i < SECRET_SIZE; i++)
        diff |= (unsigned char)(i < len ? received[i] : 0) ^
                (unsigned char)(i < len ? g_secret[i] : 0);
    if (!equal || diff || len == 0)
        return "incorrect secret";
    copy_name(peer, m + 33, NAME_SIZE);
    logline("memif.init", "peer=\"%s\"", peer);
    return NULL;
}

static const char *on_add_region(struct conn *c, const uint8_t *m, int fd)
{
    uint16_t index = get16(m + 2);
    uint64_t size = get64(m + 4);
    struct stat st;
    int seals;
    void *addr;
    if (fd < 0)
        return "add_region without a region fd";
    if (index != c->nregions)
        return "region index out of order";
    if (c->nregions >= g_lim.max_regions)
        return "too many regions";
    if (size == 0 || size > g_lim.max_region_bytes)
        return "region size out of bounds";
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size < size)
        return "region fd is not a file of the announced size";
    seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK))
        return "region fd is not sealed against shrinking (F_SEAL_SHRINK)";
    addr = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED)
        return "cannot map the region";
    c->regions[c->nregions].addr = addr;
    c->regions[c->nregions].size = size;
    c->nregions++;
    return NULL;
}

static int is_eventfd(int fd)
{
    char path[64], target[64];
    ssize_t n;
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    n = readlink(path, target, sizeof(target) - 1);
    if (n <= 0)
        return 0;
    target[n] = 0;
    if (strcmp(target, "anon_inode:[eventfd]") != 0)
        return 0;
    return fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) == 0;
}

static const char *on_add_ring(struct conn *c, const uint8_t *m, int fd)
{
    uint16_t flags = get16(m + 2), index = get16(m + 4), region = get16(m + 6);
    uint32_t offset = get32(m + 8);
    uint8_t log2 = m[12];
    uint16_t priv = get16(m + 13);
    int c2s = flags & ADD_RING_FLAG_C2S;
    unsigned *count = c2s ? &c->nc2s : &c->ns2c;
    struct ring *r;
    uint64_t bytes;
    if (fd < 0 || !is_eventfd(fd))
        return "add_ring without an interrupt eventfd";
    if (flags & ~ADD_RING_FLAG_C2S)
        return "unknown add_ring flags";
    if (index != *count)
        return "ring index out of order";
    if (*count >= g_lim.max_rings)
        return "too many rings";
    if (log2 < 1 || log2 > g_lim.max_log2_ring)
        return "ring size out of bounds";
    if (priv != 0)
        return "private headers are not supported";
    if (region >= c->nregions)
        return "ring in an unknown region";
    bytes = RING_HEADER + ((uint64_t)DESC_SIZE << log2);
    if ((offset & 63) || (uint64_t)offset + bytes > c->regions[region].size)
        return "ring outside its region";
    r = c2s ? &c->c2s[index] : &c->s2c[index];
    r->base = c->regions[region].addr + offset;
    r->size = (uint16_t)(1u << log2);
    r->last = 0;
    r->efd = fd;
    (*count)++;
    return NULL;
}

static const char *on_connect(struct conn *c)
{
    unsigned i;
    uint32_t cookie;
    struct epoll_event ev = {.events = EPOLLIN};
    if (c->nc2s == 0 || c->ns2c == 0)
        return "connect before a ring in each direction";
    for (i = 0; i < c->nc2s + c->ns2c; i++) {
        struct ring *r = i < c->nc2s ? &c->c2s[i] : &c->s2c[i - c->nc2s];
        memcpy(&cookie, r->base, 4);
        if (cookie != COOKIE)
            return "ring without the memif cookie";
    }
    for (i = 0; i < c->nc2s; i++) {
        ev.data.u32 = 100 + i;
        if (epoll_ctl(g_epoll, EPOLL_CTL_ADD, c->c2s[i].efd, &ev) != 0)
            return "C2S interrupt fd cannot be polled";
    }
    return NULL;
}

/* Receive one message and at most one descriptor; anything else is a protocol error. */
static const char *recv_msg(struct conn *c, uint8_t *msg, int *fd, int *eof)
{
    union { char buf[CMSG_SPACE(sizeof(int) * 4)]; struct cmsghdr align; } ctl;
    uint8_t big[MSG_SIZE + 1];
    struct iovec iov = {big, sizeof(big)};
    struct msghdr mh = {0};
    struct cmsghdr *cm;
    ssize_t n;
    int nfds = 0;
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = ctl.buf;
    mh.msg_controllen = sizeof(ctl.buf);
    *fd = -1;
    *eof = 0;
    n = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return "";
    for (cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
            size_t k, count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (k = 0; k < count; k++) {
                int got;
                memcpy(&got, CMSG_DATA(cm) + k * sizeof(int), sizeof(int));
                if (nfds++ == 0)
                    *fd = got;
                else
                    close(got);
            }
        }
    }
    if (n <= 0) {
        *eof = 1;
        return n == 0 ? "client closed the control socket" : "control socket error";
    }
    if (nfds > 1 || (mh.msg_flags & MSG_CTRUNC))
        return "more than one descriptor in a message";
    if (n != MSG_SIZE || (mh.msg_flags & MSG_TRUNC))
        return "message is not 128 bytes";
    memcpy(msg, big, MSG_SIZE);
    return NULL;
}

static const char *handshake_step(struct conn *c, const uint8_t *m, int fd, int *fd_used)
{
    uint16_t type = get16(m);
    *fd_used = 0;
    if (type == T_DISCONNECT) {
        char why[97];
        copy_name(why, m + 6, 96);
        logline("memif.peer_disconnect", "reason=\"%s\"", why);
        return "peer sent disconnect";
    }
    if (c->state == S_WAIT_INIT) {
        if (type != T_INIT)
            return "expected init";
        if (fd >= 0)
            return "unexpected descriptor";
        return on_init(m);
    }
    if (c->state == S_CONNECTED)
        return "unexpected message on a connected interface";
    if (type == T_ADD_REGION) {
        const char *err = on_add_region(c, m, fd);
        if (fd >= 0)
            close(fd); /* the mapping stays valid without it */
        *fd_used = 1;
        return err;
    }
    if (type == T_ADD_RING) {
        const char *err = on_add_ring(c, m, fd);
        *fd_used = err == NULL;
        return err;
    }
    if (type == T_CONNECT)
        return fd >= 0 ? "unexpected descriptor" : on_connect(c);
    return "unexpected message type during setup";
}

static void on_control(struct conn *c)
{
    uint8_t m[MSG_SIZE];
    int fd, eof, used;
    const char *err = recv_msg(c, m, &fd, &eof);
    uint16_t type;
    if (err && !*err)
        return;
    if (err) {
        if (fd >= 0)
            close(fd);
        if (eof)
            closed(c, err);
        else
            refuse(c, err);
        return;
    }
    type = get16(m);
    err = handshake_step(c, m, fd, &used);
    if (fd >= 0 && !used)
        close(fd);
    if (err) {
        if (type == T_DISCONNECT)
            closed(c, err);
        else
            refuse(c, err);
        return;
    }
    if (type == T_CONNECT) {
        send_simple(c->fd, T_CONNECTED); /* if_name left empty */
        c->state = S_CONNECTED;
        set_carrier(1);
        logline("memif.connected", "regions=%u c2s_rings=%u s2c_rings=%u ring_slots=%u",
                c->nregions, c->nc2s, c->ns2c, (unsigned)c->c2s[0].size);
        return;
    }
    if (c->state == S_WAIT_INIT)
        c->state = S_SETUP;
    send_simple(c->fd, T_ACK);
}

/* -- data path ------------------------------------------------------------------------ */

static uint16_t load_idx(const uint8_t *p)
{
    return __atomic_load_n((const uint16_t *)p, __ATOMIC_ACQUIRE);
}

static void store_idx(uint8_t *p, uint16_t v)
{
    __atomic_store_n((uint16_t *)p, v, __ATOMIC_RELEASE);
}

#define HEAD(r) ((r)->base + 6)
#define TAIL(r) ((r)->base + 64)
#define FLAGS(r) ((r)->base + 4)

/* A checked pointer to a descriptor's buffer, or NULL. */
static uint8_t *buffer_of(struct conn *c, const struct desc *d, uint32_t len)
{
    if (d->region >= c->nregions)
        return NULL;
    if ((uint64_t)d->offset + len > c->regions[d->region].size)
        return NULL;
    return c->regions[d->region].addr + d->offset;
}

static void read_desc(const struct ring *r, uint16_t slot, struct desc *d)
{
    memcpy(d, r->base + RING_HEADER + (size_t)(slot & (r->size - 1)) * DESC_SIZE, DESC_SIZE);
}

/* Client -> tap; counts the slots it consumed into *work. NULL or a reason to drop the client. */
static const char *drain_c2s(struct conn *c, struct ring *r, unsigned *work)
{
    uint16_t head = load_idx(HEAD(r));
    uint16_t avail = (uint16_t)(head - r->last);
    if (avail > r->size)
        return "C2S ring head out of range";
    *work += avail;
    while (avail) {
        struct desc d;
        uint32_t total = 0;
        uint8_t *single = NULL;
        int ok = 1;
        do {
            uint8_t *buf;
            read_desc(r, r->last, &d);
            r->last++;
            avail--;
            buf = buffer_of(c, &d, d.length);
            if (!buf || d.length > MAX_FRAME - total) { /* total <= MAX_FRAME: no wrap */
                ok = 0;
            } else if (total == 0 && !(d.flags & DESC_FLAG_NEXT)) {
                single = buf;
                total = d.length;
            } else {
                memcpy(g_scratch + total, buf, d.length);
                total += d.length;
            }
        } while ((d.flags & DESC_FLAG_NEXT) && avail);
        if (d.flags & DESC_FLAG_NEXT)
            ok = 0; /* chain cut by the head */
        if (!ok || total < 14) {
            c->rx_bad++;
            continue;
        }
        if (write(TAP_FD, single ? single : g_scratch, total) == (ssize_t)total)
            c->rx_frames++;
    }
    store_idx(TAIL(r), r->last);
    return NULL;
}

static unsigned drain_all(struct conn *c)
{
    unsigned i, work = 0;
    for (i = 0; i < c->nc2s && c->state == S_CONNECTED; i++) {
        const char *err = drain_c2s(c, &c->c2s[i], &work);
        if (err)
            refuse(c, err);
    }
    return work;
}

static unsigned on_c2s_interrupt(struct conn *c, unsigned index)
{
    uint64_t count;
    if (index >= c->nc2s)
        return 0;
    if (read(c->c2s[index].efd, &count, sizeof(count)) < 0 && errno != EAGAIN)
        return 0;
    return drain_all(c);
}

/* Tap -> client: fill the buffers the client put on the S2C ring; drop what does not fit.
 * Returns how many frames it read from the tap. */
static unsigned on_tap(struct conn *c)
{
    struct ring *r = c->state == S_CONNECTED ? &c->s2c[0] : NULL;
    unsigned n;
    int wrote = 0;
    for (n = 0; n < BATCH; n++) {
        uint16_t free_slots = 0;
        struct desc d;
        uint8_t *buf = NULL;
        ssize_t got;
        if (r) {
            free_slots = (uint16_t)(load_idx(HEAD(r)) - r->last);
            if (free_slots > r->size) {
                refuse(c, "S2C ring head out of range");
                r = NULL;
                free_slots = 0;
            }
        }
        if (free_slots) {
            read_desc(r, r->last, &d);
            buf = buffer_of(c, &d, d.length);
        }
        if (!buf) {
            got = read(TAP_FD, g_scratch, sizeof(g_scratch));
            if (got < 0)
                break;
            if (r)
                c->tx_dropped++;
            continue;
        }
        got = read(TAP_FD, buf, d.length);
        if (got < 0)
            break;
        d.length = (uint32_t)got;
        d.flags = 0;
        {
            uint8_t *slot = r->base + RING_HEADER + (size_t)(r->last & (r->size - 1)) * DESC_SIZE;
            memcpy(slot, &d.flags, 2);
            memcpy(slot + 4, &d.length, 4);
        }
        r->last++;
        c->tx_frames++;
        wrote = 1;
    }
    if (wrote && r) {
        uint16_t flags;
        store_idx(TAIL(r), r->last);
        memcpy(&flags, FLAGS(r), 2);
        if (!(flags & RING_FLAG_MASK_INT)) {
            uint64_t one = 1;
            if (write(r->efd, &one, sizeof(one)) < 0) {
                /* the client's counter is saturated: it will still see the tail */
            }
        }
    }
    return n;
}

/* -- adaptive polling: spin briefly while traffic flows, sleep in epoll when idle ---------- */

static long long now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Ask the client not to signal C2S frames (we are polling) or to signal them again. */
static void mask_c2s(struct conn *c, int masked)
{
    unsigned i;
    for (i = 0; i < c->nc2s; i++) {
        uint16_t flags = masked ? RING_FLAG_MASK_INT : 0;
        __atomic_store_n((uint16_t *)FLAGS(&c->c2s[i]), flags, __ATOMIC_RELEASE);
    }
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

/* After traffic: poll rings and tap until nothing came for poll_us, at most SPIN_SLICE_US in
 * one go (the control socket and new clients are served between slices). Returns 1 when the
 * slice ended with traffic still flowing (poll again at once), 0 when idle (sleep). */
#define SPIN_SLICE_US 2000
static int spin(struct conn *c)
{
    long long start = now_us(), idle_until = start + g_lim.poll_us;
    if (c->state != S_CONNECTED || g_lim.poll_us == 0)
        return 0;
    mask_c2s(c, 1);
    while (c->state == S_CONNECTED && !g_stop) {
        long long t;
        unsigned work = drain_all(c);
        if (c->state != S_CONNECTED)
            return 0;
        work += on_tap(c);
        t = now_us();
        if (work)
            idle_until = t + g_lim.poll_us;
        else if (t >= idle_until)
            break;
        if (t - start >= SPIN_SLICE_US)
            return 1;
    }
    if (c->state != S_CONNECTED)
        return 0;
    mask_c2s(c, 0);
    /* frames that came while the mask was set, before the client could see it cleared */
    return drain_all(c) > 0 && c->state == S_CONNECTED;
}

/* -- main loop ------------------------------------------------------------------------ */

static void on_accept(struct conn *c)
{
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = 2};
    int fd = accept4(LISTEN_FD, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0)
        return;
    if (c->state != S_IDLE) {
        logline("memif.refused", "reason=\"interface already has a client\" state=%d",
                (int)c->state);
        send_disconnect(fd, "interface already has a client");
        close(fd);
        return;
    }
    c->fd = fd;
    c->state = S_WAIT_INIT;
    c->deadline_ms = now_ms() + g_lim.handshake_ms;
    epoll_ctl(g_epoll, EPOLL_CTL_ADD, fd, &ev);
    send_hello(fd);
}

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

static int parse_limit(const char *arg, const char *key, unsigned long long lo,
                       unsigned long long hi, unsigned long long *out)
{
    size_t klen = strlen(key);
    char *end;
    unsigned long long v;
    if (strncmp(arg, key, klen) != 0 || arg[klen] != '=')
        return 0;
    errno = 0;
    v = strtoull(arg + klen + 1, &end, 10);
    if (errno || *end || v < lo || v > hi) {
        fprintf(stderr, "podwire-memif: %s must be an integer in [%llu, %llu]\n", key, lo, hi);
        exit(2);
    }
    *out = v;
    return 1;
}

static void parse_args(int argc, char **argv)
{
    int i;
    for (i = 1; i < argc; i++) {
        unsigned long long v;
        if (strncmp(argv[i], "--name=", 7) == 0)
            g_name = argv[i] + 7;
        else if (parse_limit(argv[i], "--listen-fd", 0, 65535, &v))
            LISTEN_FD = (int)v;
        else if (parse_limit(argv[i], "--tap-fd", 0, 65535, &v))
            TAP_FD = (int)v;
        else if (parse_limit(argv[i], "--max-regions", 1, HARD_MAX_REGIONS, &v))
            g_lim.max_regions = (unsigned)v;
        else if (parse_limit(argv[i], "--max-rings", 1, HARD_MAX_RINGS, &v))
            g_lim.max_rings = (unsigned)v;
        else if (parse_limit(argv[i], "--max-log2-ring", 1, 15, &v))
            g_lim.max_log2_ring = (unsigned)v;
        else if (parse_limit(argv[i], "--max-region-bytes", 4096, 1ull << 34, &v))
            g_lim.max_region_bytes = v;
        else if (parse_limit(argv[i], "--handshake-ms", 1, 600000, &v))
            g_lim.handshake_ms = (unsigned)v;
        else if (parse_limit(argv[i], "--poll-us", 0, 100000, &v))
            g_lim.poll_us = (unsigned)v;
        else {
            fprintf(stderr, "podwire-memif: unknown argument %s\n", argv[i]);
            exit(2);
        }
    }
}

int main(int argc, char **argv)
{
    struct conn c;
    int busy = 0;
    struct epoll_event ev = {.events = EPOLLIN};
    const char *secret = getenv("PODWIRE_MEMIF_SECRET");
    struct sigaction sa = {0};
    parse_args(argc, argv);
    if (!secret || !*secret || strlen(secret) > SECRET_SIZE) {
        fprintf(stderr, "podwire-memif: PODWIRE_MEMIF_SECRET must hold 1-24 characters\n");
        return 2;
    }
    g_secret_len = strlen(secret);
    memcpy(g_secret, secret, g_secret_len);
    unsetenv("PODWIRE_MEMIF_SECRET");
    if (LISTEN_FD < 0 || TAP_FD < 0 || LISTEN_FD == TAP_FD || fcntl(LISTEN_FD, F_GETFD) < 0 ||
        fcntl(TAP_FD, F_GETFD) < 0) {
        fprintf(stderr, "podwire-memif: --listen-fd and --tap-fd must name two open fds\n");
        return 2;
    }
    fcntl(LISTEN_FD, F_SETFL, fcntl(LISTEN_FD, F_GETFL) | O_NONBLOCK);
    fcntl(TAP_FD, F_SETFL, fcntl(TAP_FD, F_GETFL) | O_NONBLOCK);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stderr, NULL, _IOLBF, 0);
    g_epoll = epoll_create1(EPOLL_CLOEXEC);
    memset(&c, 0, sizeof(c));
    c.fd = -1;
    ev.data.u32 = 1;
    epoll_ctl(g_epoll, EPOLL_CTL_ADD, LISTEN_FD, &ev);
    ev.data.u32 = 3;
    epoll_ctl(g_epoll, EPOLL_CTL_ADD, TAP_FD, &ev);
    set_carrier(0);
    logline("memif.listening", "max_regions=%u max_rings=%u max_log2_ring=%u poll_us=%u",
            g_lim.max_regions, g_lim.max_rings, g_lim.max_log2_ring, g_lim.poll_us);
    while (!g_stop) {
        struct epoll_event evs[16];
        int timeout = busy ? 0 : -1, n, i;
        unsigned work = 0;
        if (c.state == S_WAIT_INIT || c.state == S_SETUP) {
            long long left = c.deadline_ms - now_ms();
            if (left <= 0) {
                refuse(&c, "handshake not finished in time");
                continue;
            }
            timeout = (int)left;
        }
        n = epoll_wait(g_epoll, evs, 16, timeout);
        for (i = 0; i < n; i++) {
            uint32_t tag = evs[i].data.u32;
            if (tag == 1)
                on_accept(&c);
            else if (tag == 2 && c.fd >= 0)
                on_control(&c);
            else if (tag == 3)
                work += on_tap(&c);
            else if (tag >= 100 && c.state == S_CONNECTED)
                work += on_c2s_interrupt(&c, tag - 100);
        }
        busy = (work || busy) ? spin(&c) : 0;
    }
    if (c.state != S_IDLE)
        send_disconnect(c.fd, "master stopping");
    logline("memif.stopped", "rx_frames=%llu tx_frames=%llu", (unsigned long long)c.rx_frames,
            (unsigned long long)c.tx_frames);
    return 0;
}
