/*
 * podwire-memif: the node's memif master. One process serves every memif port of the node.
 *
 * The agent binds a control socket (--control-fd: a listening SOCK_SEQPACKET socket, mode
 * 0600) and, per memif port, adds the grant's listening socket and the port's tap over it
 * (op ADD with both descriptors, the port's name, secret, switching domain and path). For each
 * port this program speaks the memif control protocol (hello, init with the secret checked,
 * regions, rings, connect) with every field validated against the limits given on the command
 * line, then moves frames:
 *
 *   kernel path   client's C2S rings -> the port's tap (the network's bridge, where the port's
 *                 security groups and port security are enforced), tap -> S2C ring;
 *   shared path   between two ports of the same domain that the agent marked shared: ring to
 *                 ring, by destination MAC learned from the frames each shared port's client
 *                 sends. Broadcast, multicast and unknown unicast go to the tap as on the
 *                 kernel path, so the bridge floods them. A port with port security on has a
 *                 classifier (op POLICY: its security groups and port security, compiled by
 *                 the agent): frames ring to ring are judged by the sender's and the
 *                 receiver's, with connection tracking for stateful groups (--max-flows).
 *
 * The path is per port and only the agent changes it (op PATH). This process is single
 * threaded: once the reply to a PATH that clears "shared" is sent, no frame of that port moves
 * ring to ring any more. It sleeps in epoll between frames (the clients' eventfds, the taps and
 * the sockets wake it) and polls for --poll-us after traffic.
 *
 * Everything a client shares (messages, ring indexes, descriptors) is untrusted: a descriptor
 * is copied before it is checked and used, and memory is only touched inside a region whose
 * file cannot shrink (F_SEAL_SHRINK), so a client can neither make this process read or write
 * outside the regions it mapped nor fault it. A frame a classifier judges is copied out of the
 * client's memory first and judged, learned and forwarded from that copy only. A client that stops draining its S2C ring only
 * loses its own frames (counted as ring_full); nobody waits for it.
 *
 * Written from DPDK's doc/guides/nics/memif.rst description of the wire protocol.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/if_tun.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

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
#define MAX_PORTS 256
#define MAX_AGENTS 4
#define PORT_NAME 16   /* a tap's name: IFNAMSIZ */
#define FDB_SIZE 4096  /* learned MACs of shared ports, all domains; a power of two */
#define FDB_PROBE 8
#define FDB_AGE_MS 300000

/* The agent's control protocol: requests of CTL_REQ bytes (op u32 | name[16] | secret[28] |
 * domain[16] | shared u32 | mac[6] | zeros), replies of CTL_REP bytes (status u32 | text or a port). */
#define CTL_REQ 80
#define REQ_NAME 4
#define REQ_SECRET 20
#define REQ_SECRET_SIZE 28
#define REQ_DOMAIN 48
#define REQ_SHARED 64
#define REQ_MAC 68
#define REQ_END 74
#define CTL_REP 192
enum ctl_op { OP_ADD = 1, OP_REMOVE = 2, OP_PATH = 3, OP_LIST = 4, OP_POLICY = 5 };
enum ctl_status { ST_OK = 0, ST_ERROR = 1, ST_PORT = 2 };

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
};

/* Counters of one port, as reported to the agent (OP_LIST) in this order. */
struct stats {
    uint64_t from_client;  /* frames the client sent */
    uint64_t to_client;    /* frames put on the client's S2C ring */
    uint64_t to_kernel;    /* frames written to the tap */
    uint64_t to_shared;    /* frames of this client put ring to ring on another port */
    uint64_t bad;          /* client frames dropped: bad descriptor, chain or length */
    uint64_t ring_full;    /* frames for this client dropped: no free S2C buffer */
    uint64_t kernel_drops; /* frames the tap refused */
    uint64_t connects;     /* clients that completed the handshake */
    /* ring to ring with a classifier in force (#38); a drop counts on the port whose policy
     * dropped it */
    uint64_t admitted;     /* frames this port's classifier admitted (sent or received) */
    uint64_t spoofed;      /* frames this port sent that its port security dropped (step 1) */
    uint64_t denied;       /* frames no rule of this port admitted */
    uint64_t invalid;      /* frames conntrack calls invalid, or IP that does not add up */
    uint64_t flows_full;   /* new flows dropped: the flow table was full */
};

struct classifier;

struct port {
    int used;
    char name[PORT_NAME];
    char secret[SECRET_SIZE + 1];
    size_t secret_len;
    int listen_fd, tap_fd;
    int domain; /* index into g_domains */
    int shared;
    uint8_t mac[6]; /* the Neutron port's; all zero: not given */
    int pending; /* S2C tail not yet published */
    struct classifier *cls; /* security groups in force ring to ring; NULL: unfiltered */
    struct conn c;
    struct stats st;
};

static struct limits g_lim = {1, 2, 14, 1ull << 28, 5000, 0};
static volatile sig_atomic_t g_stop;
static int g_epoll = -1;
static int g_control = -1;
static int g_agents[MAX_AGENTS];
static struct port g_ports[MAX_PORTS];
static char g_domains[MAX_PORTS][PORT_NAME];
static uint8_t g_scratch[MAX_FRAME];
static unsigned g_domain_filters[MAX_PORTS]; /* per domain: its ports with a classifier */
static long long g_now_ms;

struct fdb_entry {
    uint8_t mac[6];
    int16_t port; /* -1: free */
    int pinned;   /* the port's own Neutron MAC: not learned elsewhere, never aged */
    int domain;
    long long seen_ms;
};
static struct fdb_entry g_fdb[FDB_SIZE];

/* epoll tags: kind in the low byte, port index above it, ring index above that */
enum kind { K_CONTROL = 1, K_AGENT, K_LISTEN, K_CLIENT, K_TAP, K_C2S };
static uint64_t tag(int kind, int port, unsigned ring)
{
    return (uint64_t)kind | ((uint64_t)port << 8) | ((uint64_t)ring << 24);
}

/* -- logging: "event key=value" lines, like the agent's text logs ------------------------ */

static void logline(const char *event, const char *name, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s name=%s %s\n", event, name, buf);
}

static long long now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static long long now_ms(void) { return now_us() / 1000; }

/* -- little-endian field access into a message -------------------------------------------- */

static uint16_t get16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static uint32_t get32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

static int zeros(const uint8_t *p, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

static void copy_name(char *out, const uint8_t *field, size_t size)
{
    size_t i;
    for (i = 0; i < size && field[i]; i++)
        out[i] = (field[i] >= 0x20 && field[i] < 0x7f && field[i] != '"') ? (char)field[i] : '?';
    out[i] = 0;
}

/* Receive one message of exactly `size` bytes and at most `maxfds` descriptors (returned in
 * fds, the rest -1). NULL, "" (nothing to read) or the reason the message is refused. */
static const char *recv_exact(int sock, uint8_t *msg, size_t size, int *fds, int maxfds,
                              int *eof, const char *size_error)
{
    union { char buf[CMSG_SPACE(sizeof(int) * 4)]; struct cmsghdr align; } ctl;
    uint8_t big[MSG_SIZE + 1];
    struct iovec iov = {big, size + 1};
    struct msghdr mh = {0};
    struct cmsghdr *cm;
    ssize_t n;
    int nfds = 0, i;
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = ctl.buf;
    mh.msg_controllen = sizeof(ctl.buf);
    for (i = 0; i < maxfds; i++)
        fds[i] = -1;
    *eof = 0;
    n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return "";
    for (cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
            size_t k, count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (k = 0; k < count; k++) {
                int got;
                memcpy(&got, CMSG_DATA(cm) + k * sizeof(int), sizeof(int));
                if (nfds < maxfds)
                    fds[nfds] = got;
                else
                    close(got);
                nfds++;
            }
        }
    }
    if (n <= 0) {
        for (i = 0; i < maxfds; i++)
            if (fds[i] >= 0)
                close(fds[i]);
        *eof = 1;
        return n == 0 ? "client closed the control socket" : "control socket error";
    }
    if (nfds > maxfds || (mh.msg_flags & MSG_CTRUNC)) {
        for (i = 0; i < maxfds; i++)
            if (fds[i] >= 0)
                close(fds[i]), fds[i] = -1;
        return maxfds <= 1 ? "more than one descriptor in a message" : "too many descriptors";
    }
    if ((size_t)n != size || (mh.msg_flags & MSG_TRUNC)) {
        for (i = 0; i < maxfds; i++)
            if (fds[i] >= 0)
                close(fds[i]), fds[i] = -1;
        return size_error;
    }
    memcpy(msg, big, size);
    return NULL;
}

/* -- memif control messages ---------------------------------------------------------------- */

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

/* -- learned MACs of shared ports ------------------------------------------------------------ */

static unsigned fdb_hash(const uint8_t *mac, int domain)
{
    uint32_t h = 2166136261u;
    int i;
    for (i = 0; i < 6; i++)
        h = (h ^ mac[i]) * 16777619u;
    return (h ^ (uint32_t)domain * 0x9e3779b9u) & (FDB_SIZE - 1);
}

static struct fdb_entry *fdb_find(const uint8_t *mac, int domain)
{
    unsigned h = fdb_hash(mac, domain), i;
    for (i = 0; i < FDB_PROBE; i++) {
        struct fdb_entry *e = &g_fdb[(h + i) & (FDB_SIZE - 1)];
        if (e->port >= 0 && e->domain == domain && memcmp(e->mac, mac, 6) == 0)
            return e;
    }
    return NULL;
}

static void fdb_learn(const uint8_t *mac, int domain, int port)
{
    unsigned h = fdb_hash(mac, domain), i;
    struct fdb_entry *e = fdb_find(mac, domain), *oldest = NULL;
    if (mac[0] & 1)
        return; /* a group address is nobody's */
    if (e && e->pinned)
        return; /* a Neutron port's MAC stays its port's, whoever sends from it */
    if (!e) {
        for (i = 0; i < FDB_PROBE && !e; i++) {
            struct fdb_entry *slot = &g_fdb[(h + i) & (FDB_SIZE - 1)];
            if (slot->port < 0 || (!slot->pinned && g_now_ms - slot->seen_ms > FDB_AGE_MS))
                e = slot;
            else if (!slot->pinned && (!oldest || slot->seen_ms < oldest->seen_ms))
                oldest = slot;
        }
        if (!e)
            e = oldest;
        if (!e)
            return; /* every slot holds a pinned MAC: this one is not learned */
        memcpy(e->mac, mac, 6);
        e->domain = domain;
        e->pinned = 0;
    }
    e->port = (int16_t)port;
    e->seen_ms = g_now_ms;
}

/* A shared port's own MAC is known before its client sends a frame. */
static void fdb_pin(struct port *p)
{
    static const uint8_t none[6];
    struct fdb_entry *e;
    if (memcmp(p->mac, none, 6) == 0)
        return;
    fdb_learn(p->mac, p->domain, (int)(p - g_ports));
    e = fdb_find(p->mac, p->domain);
    if (e && e->port == (int)(p - g_ports))
        e->pinned = 1;
}

static void fdb_forget_port(int port)
{
    unsigned i;
    for (i = 0; i < FDB_SIZE; i++)
        if (g_fdb[i].port == port)
            g_fdb[i].port = -1, g_fdb[i].pinned = 0;
}

/* -- security groups: a port's classifier (#38; docs/memif.md, "Security groups in the
 * master"). The agent hands it over as a sealed memfd (op POLICY) in the format
 * sgpolicy/classifier.py encodes; this reader refuses what that module's strict decode refuses,
 * with the same words, and copies the records into arrays of its own. ---------------------- */

typedef unsigned __int128 u128;

#define CLS_HEADER 32
#define CLS_FILTERED 1
#define CLS_STATEFUL 2
#define CLS_MAX_MACS 32
#define CLS_MAX_SOURCES 256
#define CLS_MAX_LISTS 1024
#define CLS_MAX_SPANS 16384
#define CLS_MAX_RULES 2048 /* per direction */
#define REC_MAC 8
#define REC_SOURCE 40
#define REC_LIST 16
#define REC_SPAN 32
#define REC_RULE 16
#define CLS_MAX_SIZE                                                                            \
    (CLS_HEADER + CLS_MAX_MACS * REC_MAC + CLS_MAX_SOURCES * REC_SOURCE +                     \
     CLS_MAX_LISTS * REC_LIST + CLS_MAX_SPANS * REC_SPAN + 2 * CLS_MAX_RULES * REC_RULE)
#define KIND_PORTS 1
#define KIND_ICMP 2

struct cspan {
    u128 low, high; /* addresses as numbers; IPv4 in the low 32 bits */
};

struct csource {
    struct cspan span;
    uint8_t mac; /* index into macs */
    uint8_t version;
};

struct clist {
    uint32_t first, count; /* spans[first .. first + count), sorted and disjoint */
    uint8_t version;
};

struct crule {
    uint16_t lo1, hi1, lo2, hi2; /* protocol and port, or ICMP type and code */
    uint16_t list;
    uint8_t version, kind;
};

struct classifier {
    int stateful;
    unsigned nmacs, nsources, nlists, nspans, nin, nout;
    uint8_t macs[CLS_MAX_MACS][6];
    struct csource *sources;
    struct clist *lists;
    struct cspan *spans;
    struct crule *rules; /* ingress [0, nin), then egress [nin, nin + nout) */
};

static char g_why[CTL_REP];

/* A refusal's reason with numbers in it (one at a time: this process is single-threaded). */
static const char *why(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_why, sizeof(g_why), fmt, ap);
    va_end(ap);
    return g_why;
}

static u128 get_addr(const uint8_t *p)
{
    u128 v = 0;
    int i;
    for (i = 0; i < 16; i++)
        v = (v << 8) | p[i];
    return v;
}

static uint16_t be16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static u128 top_of(int version) { return version == 4 ? (u128)0xffffffffu : ~(u128)0; }

/* Python's repr of a few bytes (b'...'), as the Python reader words a bad magic. */
static void bytes_repr(const uint8_t *b, size_t n, char *out)
{
    int single = memchr(b, '\'', n) == NULL || memchr(b, '"', n) != NULL;
    char quote = single ? '\'' : '"';
    size_t i;
    *out++ = 'b';
    *out++ = quote;
    for (i = 0; i < n; i++) {
        if (b[i] == '\\' || b[i] == (uint8_t)quote)
            out += sprintf(out, "\\%c", b[i]);
        else if (b[i] == '\t' || b[i] == '\n' || b[i] == '\r')
            out += sprintf(out, "\\%c", b[i] == '\t' ? 't' : b[i] == '\n' ? 'n' : 'r');
        else if (b[i] < 0x20 || b[i] >= 0x7f)
            out += sprintf(out, "\\x%02x", b[i]);
        else
            *out++ = (char)b[i];
    }
    *out++ = quote;
    *out = 0;
}

static void cls_free(struct classifier *c)
{
    if (!c)
        return;
    free(c->sources);
    free(c->lists);
    free(c->spans);
    free(c->rules);
    free(c);
}

/* The header's flags and record counts, checked against the blob's length. */
static const char *cls_header(const uint8_t *b, size_t len, unsigned *flags, unsigned counts[6])
{
    static const char *const names[6] = {"MAX_MACS", "MAX_SOURCES", "MAX_LISTS",
                                         "MAX_SPANS", "MAX_RULES", "MAX_RULES"};
    static const unsigned limits[6] = {CLS_MAX_MACS, CLS_MAX_SOURCES, CLS_MAX_LISTS,
                                       CLS_MAX_SPANS, CLS_MAX_RULES, CLS_MAX_RULES};
    static const unsigned sizes[6] = {REC_MAC, REC_SOURCE, REC_LIST, REC_SPAN, REC_RULE, REC_RULE};
    unsigned long long expected = CLS_HEADER;
    int i, any = 0;
    if (len < CLS_HEADER || len > CLS_MAX_SIZE)
        return why("%zu bytes: not within the header's %d and MAX_SIZE = %d", len, CLS_HEADER,
                   CLS_MAX_SIZE);
    if (memcmp(b, "PWCL", 4) != 0) {
        char magic[24];
        bytes_repr(b, 4, magic);
        return why("magic %s is not b'PWCL'", magic);
    }
    if (get16(b + 4) != 1)
        return why("format version %u: this reader knows 1", (unsigned)get16(b + 4));
    if (get16(b + 6) != CLS_HEADER)
        return why("header size %u is not %d", (unsigned)get16(b + 6), CLS_HEADER);
    if (get16(b + 22) || !zeros(b + 28, 4))
        return "header: reserved bytes not zero";
    *flags = get16(b + 8);
    if (*flags & ~(unsigned)(CLS_FILTERED | CLS_STATEFUL))
        return why("unknown flags %#x", *flags);
    for (i = 0; i < 6; i++) {
        counts[i] = get16(b + 10 + 2 * i);
        if (counts[i] > limits[i])
            return why("%u records: over %s = %u", counts[i], names[i], limits[i]);
        expected += (unsigned long long)sizes[i] * counts[i];
        any |= counts[i] != 0;
    }
    if (get32(b + 24) != expected || len != expected)
        return why("%zu bytes, header says %u, its counts make %llu", len, get32(b + 24),
                   expected);
    if (!(*flags & CLS_FILTERED) && (*flags || any))
        return "an unfiltered classifier carries flags or records";
    return NULL;
}

/* A span of `version` addresses from two 16-byte fields; `what` names the record. */
static const char *cls_span(const uint8_t *p, int version, const char *what, struct cspan *out)
{
    out->low = get_addr(p);
    out->high = get_addr(p + 16);
    if (out->low > top_of(version) || out->high > top_of(version))
        return why("%s: address above the IPv%d range", what, version);
    if (out->low > out->high)
        return why("%s: span ends before it starts", what);
    return NULL;
}

/* Whether `next` starts at or before the address after `before` ends (overlap or adjacent). */
static int touches(const struct cspan *before, const struct cspan *next)
{
    return before->high == ~(u128)0 || next->low <= before->high + 1;
}

static const char *cls_macs(const uint8_t *b, size_t *at, struct classifier *c)
{
    unsigned i;
    static const uint8_t zero[6];
    for (i = 0; i < c->nmacs; i++, *at += REC_MAC) {
        const uint8_t *r = b + *at;
        if (!zeros(r + 6, 2))
            return why("MAC record at offset %zu: reserved bytes not zero", *at);
        if (memcmp(r, zero, 6) == 0 || (r[0] & 1))
            return why("MAC %02x:%02x:%02x:%02x:%02x:%02x is zero or multicast", r[0], r[1], r[2],
                       r[3], r[4], r[5]);
        memcpy(c->macs[i], r, 6);
    }
    for (i = 1; i < c->nmacs; i++)
        if (memcmp(c->macs[i - 1], c->macs[i], 6) >= 0)
            return "MACs not sorted ascending without repeats";
    if (!c->nmacs)
        return "a filtered classifier without a MAC";
    return NULL;
}

static const char *cls_sources(const uint8_t *b, size_t *at, struct classifier *c)
{
    unsigned i;
    for (i = 0; i < c->nsources; i++, *at += REC_SOURCE) {
        const uint8_t *r = b + *at;
        struct csource *s = &c->sources[i];
        const char *err;
        if (!zeros(r + 2, 6))
            return why("source record at offset %zu: reserved bytes not zero", *at);
        if (r[0] >= c->nmacs)
            return why("source: MAC index %u with %u MACs", r[0], c->nmacs);
        if (r[1] != 4 && r[1] != 6)
            return why("source: IP version %u is not 4 or 6", r[1]);
        s->mac = r[0];
        s->version = r[1];
        err = cls_span(r + 8, s->version, "source", &s->span);
        if (err)
            return err;
    }
    for (i = 1; i < c->nsources; i++) {
        const struct csource *x = &c->sources[i - 1], *y = &c->sources[i];
        int order = x->mac != y->mac ? (x->mac < y->mac ? -1 : 1)
                                     : (x->version > y->version) - (x->version < y->version);
        if (order > 0 || (order == 0 && touches(&x->span, &y->span)))
            return "sources not sorted, or overlapping or adjacent";
    }
    return NULL;
}

/* The lists tile the span table in order: list i starts where list i - 1 ended. */
static const char *cls_lists(const uint8_t *b, size_t *at, struct classifier *c)
{
    const uint8_t *heads = b + *at, *spans = heads + (size_t)c->nlists * REC_LIST;
    uint32_t covered = 0;
    unsigned i, k;
    for (i = 0; i < c->nlists; i++, *at += REC_LIST)
        if (!zeros(b + *at + 9, 7))
            return why("prefix list record at offset %zu: reserved bytes not zero", *at);
    *at += (size_t)c->nspans * REC_SPAN;
    for (i = 0; i < c->nlists; i++) {
        const uint8_t *h = heads + (size_t)i * REC_LIST;
        struct clist *l = &c->lists[i];
        char what[32];
        snprintf(what, sizeof(what), "prefix list %u", i);
        l->first = get32(h);
        l->count = get32(h + 4);
        l->version = h[8];
        if (l->version != 4 && l->version != 6)
            return why("%s: IP version %u is not 4 or 6", what, l->version);
        if (l->first != covered)
            return why("%s: starts at span %u, not %u (lists tile spans)", what, l->first,
                       covered);
        if ((uint64_t)l->first + l->count > c->nspans)
            return why("%s: spans %u..%llu past %u", what, l->first,
                       (unsigned long long)l->first + l->count, c->nspans);
        for (k = l->first; k < l->first + l->count; k++) {
            const char *err = cls_span(spans + (size_t)k * REC_SPAN, l->version, what,
                                       &c->spans[k]);
            if (err)
                return err;
        }
        for (k = l->first + 1; k < l->first + l->count; k++)
            if (touches(&c->spans[k - 1], &c->spans[k]))
                return why("%s: spans not sorted, or overlapping or adjacent", what);
        covered += l->count;
    }
    if (covered != c->nspans)
        return why("the prefix lists do not cover all %u spans", c->nspans);
    return NULL;
}

static const char *cls_rules(const uint8_t *b, size_t *at, struct classifier *c)
{
    unsigned i, n = c->nin + c->nout;
    for (i = 0; i < n; i++, *at += REC_RULE) {
        const uint8_t *r = b + *at;
        struct crule *rule = &c->rules[i];
        unsigned top2;
        if (!zeros(r + 12, 4))
            return why("rule record at offset %zu: reserved bytes not zero", *at);
        if (r[0] != 4 && r[0] != 6)
            return why("rule: IP version %u is not 4 or 6", r[0]);
        if (r[1] != KIND_PORTS && r[1] != KIND_ICMP)
            return why("rule: kind %u is not %d or %d", r[1], KIND_PORTS, KIND_ICMP);
        rule->version = r[0];
        rule->kind = r[1];
        rule->lo1 = get16(r + 2);
        rule->hi1 = get16(r + 4);
        rule->lo2 = get16(r + 6);
        rule->hi2 = get16(r + 8);
        rule->list = get16(r + 10);
        top2 = rule->kind == KIND_PORTS ? 65535 : 255;
        if (!(rule->lo1 <= rule->hi1 && rule->hi1 <= 255))
            return why("rule: range %u-%u is not within 0-255", rule->lo1, rule->hi1);
        if (!(rule->lo2 <= rule->hi2 && rule->hi2 <= top2))
            return why("rule: range %u-%u is not within 0-%u", rule->lo2, rule->hi2, top2);
        if (rule->list >= c->nlists || c->lists[rule->list].version != rule->version)
            return why("rule: prefix list %u is not an IPv%u list", rule->list, rule->version);
    }
    return NULL;
}

static void *cls_array(unsigned count, size_t size)
{
    return calloc(count ? count : 1, size);
}

/* Read a blob (mapped, `len` bytes) into a classifier of this process's own: NULL and *out
 * (NULL for an unfiltered one), or the reason it is refused. */
static const char *cls_read(const uint8_t *b, size_t len, struct classifier **out)
{
    unsigned flags = 0, counts[6];
    size_t at = CLS_HEADER;
    struct classifier *c;
    const char *err = cls_header(b, len, &flags, counts);
    *out = NULL;
    if (err)
        return err;
    if (!(flags & CLS_FILTERED))
        return NULL;
    c = calloc(1, sizeof(*c));
    if (!c)
        return "out of memory";
    c->stateful = (flags & CLS_STATEFUL) != 0;
    c->nmacs = counts[0], c->nsources = counts[1], c->nlists = counts[2];
    c->nspans = counts[3], c->nin = counts[4], c->nout = counts[5];
    c->sources = cls_array(c->nsources, sizeof(*c->sources));
    c->lists = cls_array(c->nlists, sizeof(*c->lists));
    c->spans = cls_array(c->nspans, sizeof(*c->spans));
    c->rules = cls_array(c->nin + c->nout, sizeof(*c->rules));
    if (!c->sources || !c->lists || !c->spans || !c->rules)
        err = "out of memory";
    if (!err)
        err = cls_macs(b, &at, c);
    if (!err)
        err = cls_sources(b, &at, c);
    if (!err)
        err = cls_lists(b, &at, c);
    if (!err)
        err = cls_rules(b, &at, c);
    if (err) {
        cls_free(c);
        return err;
    }
    *out = c;
    return NULL;
}

/* -- a frame as the classifier reads it ----------------------------------------------------- */

#define ETH_IP 0x0800
#define ETH_ARP 0x0806
#define ETH_IP6 0x86DD
#define P_ICMP 1
#define P_TCP 6
#define P_UDP 17
#define P_ICMP6 58
#define P_FRAG6 44 /* IPv6's fragment header */
#define IP4_MF_OFFSET 0x3fff /* more fragments, fragment offset */

/* Untagged Ethernet; IPv4 with its options skipped, IPv6 without extension headers. A fragment
 * is marked and its transport bytes left unread: the master does not judge fragments. */
struct pkt {
    const uint8_t *frame;
    uint32_t len;
    uint16_t ethertype;
    int version;   /* 4 or 6 for IP (its ethertype), else 0 */
    int has_addrs; /* the fixed IP header is there: saddr and daddr are read */
    int malformed; /* IP whose header or lengths do not add up (the kernel drops it) */
    int fragment;  /* an IP fragment: its transport bytes are not the datagram's (no l4) */
    u128 saddr, daddr;
    uint8_t proto;
    const uint8_t *l4; /* the transport header and what follows, up to the IP length */
    uint32_t l4len;
};

static int ipv4_header_sum_ok(const uint8_t *ip, uint32_t ihl)
{
    uint32_t sum = 0, i;
    for (i = 0; i < ihl; i += 2)
        sum += be16(ip + i);
    while (sum >> 16)
        sum = (sum & 0xffff) + (sum >> 16);
    return sum == 0xffff;
}

static void parse_ipv4(const uint8_t *ip, uint32_t room, struct pkt *pk)
{
    uint32_t ihl = (ip[0] & 15) * 4u, total = be16(ip + 2);
    pk->has_addrs = 1;
    pk->saddr = be32(ip + 12);
    pk->daddr = be32(ip + 16);
    pk->proto = ip[9];
    pk->malformed = (ip[0] >> 4) != 4 || ihl < 20 || total < ihl || total > room ||
                    !ipv4_header_sum_ok(ip, ihl);
    pk->fragment = (be16(ip + 6) & IP4_MF_OFFSET) != 0;
    if (!pk->malformed && !pk->fragment) {
        pk->l4 = ip + ihl;
        pk->l4len = total - ihl;
    }
}

static void parse_ipv6(const uint8_t *ip, uint32_t room, struct pkt *pk)
{
    uint32_t payload = be16(ip + 4);
    pk->has_addrs = 1;
    pk->saddr = get_addr(ip + 8);
    pk->daddr = get_addr(ip + 24);
    pk->proto = ip[6];
    pk->malformed = (ip[0] >> 4) != 6 || payload > room - 40;
    pk->fragment = pk->proto == P_FRAG6;
    if (!pk->malformed && !pk->fragment) {
        pk->l4 = ip + 40;
        pk->l4len = payload;
    }
}

/* `len` >= 14 (shorter frames never get here). */
static void parse_frame(const uint8_t *frame, uint32_t len, struct pkt *pk)
{
    uint32_t room = len - 14;
    memset(pk, 0, sizeof(*pk));
    pk->frame = frame;
    pk->len = len;
    pk->ethertype = be16(frame + 12);
    if (pk->ethertype == ETH_IP) {
        pk->version = 4;
        pk->malformed = 1;
        if (room >= 20)
            parse_ipv4(frame + 14, room, pk);
    } else if (pk->ethertype == ETH_IP6) {
        pk->version = 6;
        pk->malformed = 1;
        if (room >= 40)
            parse_ipv6(frame + 14, room, pk);
    }
}

static int udp_is(const struct pkt *pk, unsigned sport, unsigned dport)
{
    return pk->proto == P_UDP && pk->l4len >= 4 && be16(pk->l4) == sport &&
           be16(pk->l4 + 2) == dport;
}

/* The ICMPv6 type of an IPv6 frame, or -1. */
static int icmp6_type(const struct pkt *pk)
{
    return pk->version == 6 && pk->proto == P_ICMP6 && pk->l4len ? pk->l4[0] : -1;
}

/* -- the classifier's two steps ------------------------------------------------------------ */

enum verdict { V_PASS, V_SPOOFED, V_DENIED, V_INVALID, V_FULL };

static int has_mac(const struct classifier *c, const uint8_t *mac)
{
    unsigned i;
    for (i = 0; i < c->nmacs; i++)
        if (memcmp(c->macs[i], mac, 6) == 0)
            return 1;
    return 0;
}

/* The port may send from `mac` with this source address. */
static int source_ok(const struct classifier *c, const uint8_t *mac, int version, u128 addr)
{
    unsigned i;
    for (i = 0; i < c->nsources; i++) {
        const struct csource *s = &c->sources[i];
        if (s->version == version && s->span.low <= addr && addr <= s->span.high &&
            memcmp(c->macs[s->mac], mac, 6) == 0)
            return 1;
    }
    return 0;
}

/* A solicitation or advertisement whose target the sending MAC may not claim. */
static int foreign_nd_target(const struct classifier *c, const struct pkt *pk)
{
    int type = icmp6_type(pk);
    if (type != 136 && !(type == 135 && pk->saddr == 0))
        return 0;
    return pk->l4len < 24 || !source_ok(c, pk->frame + 6, 6, get_addr(pk->l4 + 8));
}

/* Step 1, port security: whether the port may send this frame. */
static int may_send(const struct classifier *c, const struct pkt *pk)
{
    const uint8_t *mac = pk->frame + 6;
    int type = icmp6_type(pk);
    if (!has_mac(c, mac) || udp_is(pk, 67, 68) || udp_is(pk, 547, 546))
        return 0;
    if (type == 134 || type == 137 || foreign_nd_target(c, pk))
        return 0;
    if (pk->version && !pk->has_addrs)
        return 0;
    if (pk->version == 4)
        return source_ok(c, mac, 4, pk->saddr) ||
               (pk->saddr == 0 && pk->daddr == 0xffffffffu && udp_is(pk, 68, 67));
    if (pk->version == 6)
        return source_ok(c, mac, 6, pk->saddr) ||
               (pk->saddr == 0 && (pk->daddr >> 112) == 0xff02 &&
                (type == 131 || type == 135 || type == 143));
    if (pk->ethertype == ETH_ARP && pk->len >= 32) {
        uint32_t spa = be32(pk->frame + 28);
        return spa == 0 || source_ok(c, pk->frame + 22, 4, spa);
    }
    return 0;
}

static int in_list(const struct classifier *c, unsigned list, u128 addr)
{
    const struct cspan *s = c->spans + c->lists[list].first;
    uint32_t lo = 0, hi = c->lists[list].count;
    while (lo < hi) { /* the first span ending at or after addr */
        uint32_t mid = lo + (hi - lo) / 2;
        if (s[mid].high < addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < c->lists[list].count && s[lo].low <= addr;
}

static int rules_admit(const struct classifier *c, const struct pkt *pk, int egress)
{
    const struct crule *r = c->rules + (egress ? c->nin : 0);
    unsigned n = egress ? c->nout : c->nin, i;
    u128 remote = egress ? pk->daddr : pk->saddr;
    int icmp = pk->proto == (pk->version == 4 ? P_ICMP : P_ICMP6) && pk->l4len >= 2;
    for (i = 0; i < n; i++, r++) {
        unsigned first, second;
        if (r->version != pk->version)
            continue;
        if (r->kind == KIND_PORTS) {
            if (pk->l4len < 4) /* the port is the transport header's bytes 2-3 */
                continue;
            first = pk->proto;
            second = be16(pk->l4 + 2);
        } else {
            if (!icmp)
                continue;
            first = pk->l4[0];
            second = pk->l4[1];
        }
        if (first < r->lo1 || first > r->hi1 || second < r->lo2 || second > r->hi2)
            continue;
        if (in_list(c, r->list, remote))
            return 1;
    }
    return 0;
}

enum ct_state { CT_NEW, CT_ESTABLISHED, CT_INVALID, CT_UNTRACKED };

/* Step 2 for one direction of an IP frame, given conntrack's view of it. */
static int judge(const struct classifier *c, const struct pkt *pk, int egress, int ct)
{
    int type = icmp6_type(pk);
    if (egress && (pk->proto == P_ICMP6 || udp_is(pk, 68, 67) || udp_is(pk, 546, 547)))
        return V_PASS;
    if (!egress && (type == 130 || type == 134 || type == 135 || type == 136 ||
                    udp_is(pk, 67, 68) || udp_is(pk, 547, 546)))
        return V_PASS;
    if (c->stateful && ct == CT_INVALID)
        return V_INVALID;
    if (c->stateful && ct == CT_ESTABLISHED)
        return V_PASS;
    return rules_admit(c, pk, egress) ? V_PASS : V_DENIED;
}

/* -- connection tracking for stateful classifiers ------------------------------------------
 *
 * One table for every domain (the domain is part of the key), preallocated at start with
 * --max-flows entries of 64 bytes plus a bucket index (4 bytes per bucket, buckets the power
 * of two at or above max_flows). An entry holds a flow's two ends as its first frame had them
 * (a: source, b: destination; ports, or the ICMP echo id on both), so a frame either way finds
 * it. Entries of equal timeout and equally replied or not are kept in a list in the order they
 * were last refreshed: the head of each list is the first to expire. A new flow takes a free
 * entry, else an expired head, else evicts the least recently seen flow that never saw a reply
 * (no flow without a reply holds the long timeout, so a flood of them cannot fill the table for
 * days); when every entry saw a reply it is dropped (flows_full). Timeouts follow Linux
 * nf_conntrack's defaults; TCP's state follows its flags only (no window tracking). */

#define FLOW_NONE 0xffffffffu
#define MAX_FLOWS_DEFAULT 100000

struct flow {
    u128 a, b;           /* the first frame's source and destination */
    long long expires_ms;
    uint32_t next;       /* bucket chain, or the free list */
    uint32_t older, newer; /* its timeout list */
    uint16_t pa, pb;     /* ports as the first frame had them; ICMP: the echo id, twice */
    uint16_t domain;
    uint8_t proto, version;
    uint8_t kind;        /* ICMP: the request's type; else 0 */
    uint8_t state;       /* FS_*; FS_FREE: unused */
    uint8_t flags;       /* F_* */
    uint8_t list;        /* which list: its timeout (TO_*) * 2, + 1 while it saw no reply */
};
_Static_assert(sizeof(struct flow) == 64, "a flow is one cache line");

enum flow_state {
    FS_FREE, FS_OPEN, /* UDP, ICMP and the rest: no states but replied or not */
    FS_SYN_SENT, FS_SYN_RECV, FS_ESTABLISHED, FS_FIN, FS_TIME_WAIT, FS_CLOSE
};
#define F_REPLIED 1
#define F_FIN_A 2 /* a (the first frame's sender) sent a FIN */
#define F_FIN_B 4
#define F_BOTH_SYN 8 /* opened by a SYN each way (a simultaneous open) */

enum timeout {
    TO_CLOSE, TO_SHORT, TO_SYN_RECV, TO_MID, TO_UNREPLIED, TO_GENERIC, TO_LONG, TO_COUNT
};
static const long long g_timeout_s[TO_COUNT] = {10, 30, 60, 120, 300, 600, 5 * 24 * 3600};
#define LISTS (TO_COUNT * 2) /* per timeout: flows that saw a reply, flows that did not */

/* What a frame is to conntrack. */
struct tuple {
    u128 src, dst;
    uint16_t sport, dport;
    uint8_t proto, version, kind;
};
enum role { R_FLOW, R_REQUEST, R_REPLY, R_ERROR };

static struct flow *g_flows;
static uint32_t *g_buckets;
static uint32_t g_max_flows = MAX_FLOWS_DEFAULT, g_bucket_mask, g_free = FLOW_NONE;
static uint32_t g_oldest[LISTS], g_newest[LISTS];
static uint64_t g_seed;

static size_t flows_bytes(void)
{
    return (size_t)g_max_flows * sizeof(struct flow) + ((size_t)g_bucket_mask + 1) * 4;
}

static void flows_init(void)
{
    uint32_t i, buckets = 1;
    while (buckets < g_max_flows)
        buckets <<= 1;
    g_bucket_mask = buckets - 1;
    g_flows = aligned_alloc(64, (size_t)g_max_flows * sizeof(struct flow));
    g_buckets = malloc((size_t)buckets * 4);
    if (!g_flows || !g_buckets) {
        fprintf(stderr, "podwire-memif: cannot allocate %zu bytes for %u flows\n", flows_bytes(),
                g_max_flows);
        exit(2);
    }
    memset(g_flows, 0, (size_t)g_max_flows * sizeof(struct flow)); /* every page now */
    memset(g_buckets, 0xff, (size_t)buckets * 4);
    for (i = g_max_flows; i-- > 0;) {
        g_flows[i].next = g_free;
        g_free = i;
    }
    for (i = 0; i < LISTS; i++)
        g_oldest[i] = g_newest[i] = FLOW_NONE;
    if (getrandom(&g_seed, sizeof(g_seed), 0) != sizeof(g_seed))
        g_seed = (uint64_t)now_us() * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 32;
    x *= 0x9e3779b97f4a7c15ull;
    x ^= x >> 29;
    x *= 0x9e3779b97f4a7c15ull;
    return x ^ (x >> 32);
}

static uint64_t end_hash(u128 addr, uint16_t port)
{
    return mix(mix((uint64_t)(addr >> 64) ^ g_seed) ^ (uint64_t)addr) + port;
}

/* The same bucket for a flow's frames either way. */
static uint32_t flow_bucket(int domain, const struct tuple *t)
{
    uint64_t h = end_hash(t->src, t->sport) + end_hash(t->dst, t->dport);
    h += (uint64_t)t->proto << 40 | (uint64_t)t->kind << 32 | (uint64_t)domain << 8 | t->version;
    return (uint32_t)mix(h ^ g_seed) & g_bucket_mask;
}

static void list_unlink(uint32_t i)
{
    struct flow *f = &g_flows[i];
    if (f->older != FLOW_NONE)
        g_flows[f->older].newer = f->newer;
    else
        g_oldest[f->list] = f->newer;
    if (f->newer != FLOW_NONE)
        g_flows[f->newer].older = f->older;
    else
        g_newest[f->list] = f->older;
}

/* The flow goes last on the list of `timeout` and of whether it saw a reply. */
static void list_append(uint32_t i, int timeout)
{
    struct flow *f = &g_flows[i];
    int list = timeout * 2 + !(f->flags & F_REPLIED);
    f->list = (uint8_t)list;
    f->newer = FLOW_NONE;
    f->older = g_newest[list];
    if (f->older != FLOW_NONE)
        g_flows[f->older].newer = i;
    else
        g_oldest[list] = i;
    g_newest[list] = i;
}

static void flow_release(uint32_t i)
{
    struct flow *f = &g_flows[i];
    struct tuple t = {f->a, f->b, f->pa, f->pb, f->proto, f->version, f->kind};
    uint32_t *link = &g_buckets[flow_bucket(f->domain, &t)];
    while (*link != i && *link != FLOW_NONE)
        link = &g_flows[*link].next;
    if (*link == i)
        *link = f->next;
    list_unlink(i);
    f->state = FS_FREE;
    f->next = g_free;
    g_free = i;
}

/* Early drop, when every entry is live: the flow least recently seen of those that never
 * saw a reply makes room (a flood of unanswered flows only evicts its own kind). None when
 * every flow saw a reply. */
static void evict_unreplied(void)
{
    uint32_t victim = FLOW_NONE;
    long long seen = 0;
    int t;
    for (t = 0; t < TO_COUNT; t++) {
        uint32_t i = g_oldest[t * 2 + 1];
        long long at;
        if (i == FLOW_NONE)
            continue;
        at = g_flows[i].expires_ms - g_timeout_s[t] * 1000; /* when it was last refreshed */
        if (victim == FLOW_NONE || at < seen)
            victim = i, seen = at;
    }
    if (victim != FLOW_NONE)
        flow_release(victim);
}

/* A free entry, an expired one taken back, or an unreplied one evicted; FLOW_NONE when the
 * table is full of flows that saw a reply. */
static uint32_t flow_alloc(void)
{
    uint32_t i;
    int k;
    for (k = 0; k < LISTS && g_free == FLOW_NONE; k++)
        if (g_oldest[k] != FLOW_NONE && g_flows[g_oldest[k]].expires_ms <= g_now_ms)
            flow_release(g_oldest[k]);
    if (g_free == FLOW_NONE)
        evict_unreplied();
    i = g_free;
    if (i != FLOW_NONE)
        g_free = g_flows[i].next;
    return i;
}

/* The live flow of this tuple (either way; *reply set when the frame goes b to a), or NULL.
 * A request matches its flow's first direction only, a reply the other. */
static struct flow *flow_find(int domain, const struct tuple *t, int role, int *reply)
{
    uint32_t i = g_buckets[flow_bucket(domain, t)];
    for (; i != FLOW_NONE; i = g_flows[i].next) {
        struct flow *f = &g_flows[i];
        int ahead, back;
        if (f->domain != domain || f->proto != t->proto || f->version != t->version ||
            f->kind != t->kind || f->expires_ms <= g_now_ms)
            continue;
        ahead = f->a == t->src && f->b == t->dst && f->pa == t->sport && f->pb == t->dport;
        back = f->a == t->dst && f->b == t->src && f->pa == t->dport && f->pb == t->sport;
        if ((ahead && role != R_REPLY) || (back && role != R_REQUEST)) {
            /* A tuple that is its own reverse (an end talking to itself) reads as the flow's
             * reply, as the kernel's table finds a connection's reply half first. */
            *reply = back && role != R_REQUEST;
            return f;
        }
    }
    return NULL;
}

static void flows_forget_domain(int domain)
{
    uint32_t i;
    for (i = 0; i < g_max_flows; i++)
        if (g_flows[i].state != FS_FREE && g_flows[i].domain == domain)
            flow_release(i);
}

/* ICMP types: a request's reply, or -1 for a type that is no request. */
static int icmp_reply_of(int version, int type)
{
    if (version == 4)
        return type == 8 ? 0 : type == 13 ? 14 : type == 15 ? 16 : type == 17 ? 18 : -1;
    return type == 128 ? 129 : type == 139 ? 140 : -1;
}

static int icmp_request_of(int version, int type)
{
    if (version == 4)
        return type == 0 ? 8 : type == 14 ? 13 : type == 16 ? 15 : type == 18 ? 17 : -1;
    return type == 129 ? 128 : type == 140 ? 139 : -1;
}

static int icmp_error(int version, int type)
{
    if (version == 4)
        return type == 3 || type == 4 || type == 5 || type == 11 || type == 12;
    return type >= 1 && type <= 4;
}

/* ICMPv6 that conntrack leaves alone: MLD, router and neighbour discovery. */
static int icmp6_untracked(int type)
{
    return (type >= 130 && type <= 136) || type == 143;
}

static int has_ports(uint8_t proto)
{
    return proto == P_TCP || proto == P_UDP || proto == 33 || proto == 132 || proto == 136;
}

/* The transport part of a tuple: its role, CT_INVALID - 10 for what cannot be tracked as sent,
 * -1 for untracked. */
static int l4_tuple(int version, uint8_t proto, const uint8_t *l4, uint32_t len, struct tuple *t)
{
    t->proto = proto;
    t->version = (uint8_t)version;
    t->kind = 0;
    t->sport = t->dport = 0;
    if (proto == (version == 4 ? P_ICMP : P_ICMP6)) {
        int request, reply;
        if (len < 8)
            return -2;
        if (version == 6 && icmp6_untracked(l4[0]))
            return -1;
        if (icmp_error(version, l4[0]))
            return R_ERROR;
        reply = icmp_reply_of(version, l4[0]);
        request = icmp_request_of(version, l4[0]);
        if (reply < 0 && request < 0)
            return -2;
        t->kind = (uint8_t)(reply >= 0 ? l4[0] : request);
        t->sport = t->dport = be16(l4 + 4);
        return reply >= 0 ? R_REQUEST : R_REPLY;
    }
    if (has_ports(proto)) {
        if (len < 8)
            return -2;
        t->sport = be16(l4);
        t->dport = be16(l4 + 2);
    }
    return R_FLOW;
}

/* The packet an ICMP error quotes (after its 8-byte header), as a tuple; 0 if unreadable. */
static int quoted_tuple(const struct pkt *pk, struct tuple *t)
{
    const uint8_t *ip = pk->l4 + 8;
    uint32_t room = pk->l4len - 8, head;
    int role;
    if (pk->version == 4) {
        if (room < 20)
            return 0;
        head = (ip[0] & 15) * 4u;
        if ((ip[0] >> 4) != 4 || head < 20 || room < head + 8)
            return 0;
        t->src = be32(ip + 12);
        t->dst = be32(ip + 16);
        role = l4_tuple(4, ip[9], ip + head, room - head, t);
    } else {
        if (room < 48 || (ip[0] >> 4) != 6)
            return 0;
        t->src = get_addr(ip + 8);
        t->dst = get_addr(ip + 24);
        role = l4_tuple(6, ip[6], ip + 40, room - 40, t);
    }
    return role == R_FLOW || role == R_REQUEST || role == R_REPLY;
}

#define TCP_FIN 0x01
#define TCP_SYN 0x02
#define TCP_RST 0x04
#define TCP_ACK 0x10
#define TCP_URG 0x20

/* TCP flags conntrack takes (PSH, ECE and CWR aside), else -1. */
static int tcp_flags(const uint8_t *l4, uint32_t len)
{
    unsigned offset, f;
    if (len < 20)
        return -1;
    offset = (l4[12] >> 4) * 4u;
    f = l4[13] & (TCP_FIN | TCP_SYN | TCP_RST | TCP_ACK | TCP_URG);
    if (offset < 20 || offset > len)
        return -1;
    switch (f) {
    case TCP_SYN: case TCP_SYN | TCP_URG: case TCP_SYN | TCP_ACK: case TCP_RST:
    case TCP_RST | TCP_ACK: case TCP_FIN | TCP_ACK: case TCP_FIN | TCP_ACK | TCP_URG:
    case TCP_ACK: case TCP_ACK | TCP_URG:
        return (int)f;
    default:
        return -1;
    }
}

/* Conntrack's view of one IP frame, before any verdict. */
struct track {
    int state;     /* CT_* */
    int role;      /* R_* */
    int tcp;       /* its flags, for TCP */
    int reply;     /* the frame goes the flow's second way */
    struct flow *flow; /* its flow, if live */
    int reopen;    /* a SYN on a closed TCP flow: a new flow replaces it */
    struct tuple t;
};

static int ct_tcp(struct track *k)
{
    int f = k->tcp;
    if (f < 0)
        return CT_INVALID;
    if (k->flow && (f & TCP_SYN) && !(f & TCP_ACK) &&
        (k->flow->state == FS_CLOSE || k->flow->state == FS_TIME_WAIT)) {
        k->reopen = 1;
        return CT_NEW;
    }
    if (!k->flow) /* a bare SYN opens a flow, an ACK picks one up midstream */
        return ((f & ~TCP_URG) == TCP_SYN || (f & ~TCP_URG) == TCP_ACK) ? CT_NEW : CT_INVALID;
    if (!k->reply && (f & (TCP_SYN | TCP_ACK)) == (TCP_SYN | TCP_ACK) &&
        k->flow->state != FS_SYN_RECV)
        return CT_INVALID; /* the opener answering its own SYN */
    if (k->reply && (f & (TCP_SYN | TCP_ACK)) == TCP_SYN && k->flow->state != FS_SYN_SENT &&
        !(k->flow->flags & F_BOTH_SYN))
        return CT_INVALID; /* a second opening SYN from the answering end */
    return (k->reply || (k->flow->flags & F_REPLIED)) ? CT_ESTABLISHED : CT_NEW;
}

static void ct_lookup(int domain, const struct pkt *pk, struct track *k)
{
    memset(k, 0, sizeof(*k));
    k->t.src = pk->saddr;
    k->t.dst = pk->daddr;
    k->role = l4_tuple(pk->version, pk->proto, pk->l4, pk->l4len, &k->t);
    if (k->role == -1 || k->role == -2) {
        k->state = k->role == -1 ? CT_UNTRACKED : CT_INVALID;
        return;
    }
    if (k->role == R_ERROR) {
        struct tuple quoted;
        int reply;
        k->state = quoted_tuple(pk, &quoted) && flow_find(domain, &quoted, R_FLOW, &reply)
                       ? CT_ESTABLISHED /* related */
                       : CT_INVALID;
        return;
    }
    if (pk->proto == P_UDP && (be16(pk->l4 + 4) < 8 || be16(pk->l4 + 4) > pk->l4len)) {
        k->state = CT_INVALID;
        return;
    }
    k->flow = flow_find(domain, &k->t, k->role, &k->reply);
    if (pk->proto == P_TCP) {
        k->tcp = tcp_flags(pk->l4, pk->l4len);
        k->state = ct_tcp(k);
    } else if (!k->flow) {
        k->state = k->role == R_REPLY ? CT_INVALID : CT_NEW;
    } else {
        k->state = (k->reply || (k->flow->flags & F_REPLIED)) ? CT_ESTABLISHED : CT_NEW;
    }
}

/* The state a TCP flow goes to with an admitted frame; *fin: the flow's flags. */
static uint8_t tcp_next(const struct flow *f, int reply, int flags, uint8_t *fin)
{
    if (flags & TCP_RST)
        return FS_CLOSE;
    if (flags & TCP_FIN) {
        *fin |= reply ? F_FIN_B : F_FIN_A;
        return (*fin & F_FIN_A) && (*fin & F_FIN_B) ? FS_TIME_WAIT : FS_FIN;
    }
    if (f->state == FS_SYN_SENT && reply && (flags & TCP_SYN)) {
        if (!(flags & TCP_ACK))
            *fin |= F_BOTH_SYN;
        return FS_SYN_RECV;
    }
    if (f->state == FS_SYN_RECV && !reply && flags == TCP_ACK)
        return FS_ESTABLISHED;
    return f->state;
}

static int timeout_of(const struct flow *f)
{
    switch (f->state) {
    case FS_SYN_SENT: case FS_FIN: case FS_TIME_WAIT:
        return TO_MID;
    case FS_SYN_RECV:
        return TO_SYN_RECV;
    case FS_ESTABLISHED: /* picked up midstream: long only once the other end answered */
        return (f->flags & F_REPLIED) ? TO_LONG : TO_UNREPLIED;
    case FS_CLOSE:
        return TO_CLOSE;
    default:
        break;
    }
    if (f->proto == P_UDP)
        return (f->flags & F_REPLIED) ? TO_MID : TO_SHORT;
    if (f->proto == P_ICMP || f->proto == P_ICMP6)
        return TO_SHORT;
    return TO_GENERIC;
}

static struct flow *flow_open(int domain, const struct track *k)
{
    uint32_t i = flow_alloc(), *bucket;
    struct flow *f;
    if (i == FLOW_NONE)
        return NULL;
    f = &g_flows[i];
    memset(f, 0, sizeof(*f));
    f->a = k->t.src, f->b = k->t.dst;
    f->pa = k->t.sport, f->pb = k->t.dport;
    f->domain = (uint16_t)domain;
    f->proto = k->t.proto, f->version = k->t.version, f->kind = k->t.kind;
    f->state = k->t.proto != P_TCP ? FS_OPEN : (k->tcp & TCP_SYN) ? FS_SYN_SENT : FS_ESTABLISHED;
    bucket = &g_buckets[flow_bucket(domain, &k->t)];
    f->next = *bucket;
    *bucket = i;
    list_append(i, TO_SHORT);
    return f;
}

/* An admitted frame updates its flow, or opens one; 0 when a new flow finds the table full. */
static int ct_commit(int domain, struct track *k)
{
    struct flow *f = k->flow;
    uint32_t i;
    if (k->role == R_ERROR || (k->state != CT_NEW && k->state != CT_ESTABLISHED))
        return 1;
    if (f && k->reopen) {
        flow_release((uint32_t)(f - g_flows));
        f = NULL;
    }
    if (!f) {
        f = flow_open(domain, k);
        if (!f)
            return 0;
    } else {
        if (k->reply)
            f->flags |= F_REPLIED;
        if (f->proto == P_TCP)
            f->state = tcp_next(f, k->reply, k->tcp, &f->flags);
    }
    i = (uint32_t)(f - g_flows);
    list_unlink(i);
    list_append(i, timeout_of(f));
    f->expires_ms = g_now_ms + g_timeout_s[f->list / 2] * 1000;
    return 1;
}

/* -- connection lifetime -------------------------------------------------------------------- */

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

static void set_carrier(struct port *p, int on)
{
#ifdef TUNSETCARRIER
    unsigned int value = on ? 1 : 0;
    ioctl(p->tap_fd, TUNSETCARRIER, &value);
#else
    (void)p;
    (void)on;
#endif
}

static void drop_client(struct port *p)
{
    if (p->c.state == S_CONNECTED) {
        set_carrier(p, 0);
        fdb_forget_port((int)(p - g_ports));
        if (p->shared)
            fdb_pin(p); /* its next client is its MAC's too, sending or not */
    }
    p->pending = 0;
    reset_conn(&p->c);
}

/* Refuse the client: tell it why (memif's disconnect message), log it, keep listening. */
static void refuse(struct port *p, const char *reason)
{
    logline("memif.refused", p->name, "reason=\"%s\" state=%d", reason, (int)p->c.state);
    send_disconnect(p->c.fd, reason);
    drop_client(p);
}

static void closed(struct port *p, const char *why)
{
    if (p->c.state == S_CONNECTED)
        logline("memif.disconnected", p->name,
                "reason=\"%s\" from_client=%llu to_client=%llu ring_full=%llu", why,
                (unsigned long long)p->st.from_client, (unsigned long long)p->st.to_client,
                (unsigned long long)p->st.ring_full);
    else
        logline("memif.refused", p->name, "reason=\"%s\" state=%d", why, (int)p->c.state);
    drop_client(p);
}

/* -- handshake steps; each returns NULL or the reason to refuse ----------------------------- */

static const char *on_init(struct port *p, const uint8_t *m)
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
    equal = len == p->secret_len || (p->secret_len == SECRET_SIZE && len == SECRET_SIZE - 1);
    for (i = 0; i < SECRET_SIZE; i++)
        diff |= (unsigned char)(i < len ? received[i] : 0) ^
                (unsigned char)(i < len ? p->secret[i] : 0);
    if (!equal || diff || len == 0)
        return "incorrect secret";
    copy_name(peer, m + 33, NAME_SIZE);
    logline("memif.init", p->name, "peer=\"%s\"", peer);
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

static int fd_is(int fd, const char *target_name)
{
    char path[64], target[64];
    ssize_t n;
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    n = readlink(path, target, sizeof(target) - 1);
    if (n <= 0)
        return 0;
    target[n] = 0;
    return strcmp(target, target_name) == 0;
}

static int is_eventfd(int fd)
{
    if (!fd_is(fd, "anon_inode:[eventfd]"))
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

static const char *on_connect(struct port *p)
{
    struct conn *c = &p->c;
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
        ev.data.u64 = tag(K_C2S, (int)(p - g_ports), i);
        if (epoll_ctl(g_epoll, EPOLL_CTL_ADD, c->c2s[i].efd, &ev) != 0)
            return "C2S interrupt fd cannot be polled";
    }
    return NULL;
}

static const char *handshake_step(struct port *p, const uint8_t *m, int fd, int *fd_used)
{
    struct conn *c = &p->c;
    uint16_t type = get16(m);
    *fd_used = 0;
    if (type == T_DISCONNECT) {
        char why[97];
        copy_name(why, m + 6, 96);
        logline("memif.peer_disconnect", p->name, "reason=\"%s\"", why);
        return "peer sent disconnect";
    }
    if (c->state == S_WAIT_INIT) {
        if (type != T_INIT)
            return "expected init";
        if (fd >= 0)
            return "unexpected descriptor";
        return on_init(p, m);
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
        return fd >= 0 ? "unexpected descriptor" : on_connect(p);
    return "unexpected message type during setup";
}

static void on_client(struct port *p)
{
    uint8_t m[MSG_SIZE];
    int fd, eof, used;
    const char *err = recv_exact(p->c.fd, m, MSG_SIZE, &fd, 1, &eof, "message is not 128 bytes");
    uint16_t type;
    if (err && !*err)
        return;
    if (err) {
        if (eof)
            closed(p, err);
        else
            refuse(p, err);
        return;
    }
    type = get16(m);
    err = handshake_step(p, m, fd, &used);
    if (fd >= 0 && !used)
        close(fd);
    if (err) {
        if (type == T_DISCONNECT)
            closed(p, err);
        else
            refuse(p, err);
        return;
    }
    if (type == T_CONNECT) {
        send_simple(p->c.fd, T_CONNECTED); /* if_name left empty */
        p->c.state = S_CONNECTED;
        p->st.connects++;
        set_carrier(p, 1);
        logline("memif.connected", p->name,
                "regions=%u c2s_rings=%u s2c_rings=%u ring_slots=%u path=%s", p->c.nregions,
                p->c.nc2s, p->c.ns2c, (unsigned)p->c.c2s[0].size,
                p->shared ? "shared" : "kernel");
        return;
    }
    if (p->c.state == S_WAIT_INIT)
        p->c.state = S_SETUP;
    send_simple(p->c.fd, T_ACK);
}

static void on_accept(struct port *p)
{
    struct epoll_event ev = {.events = EPOLLIN};
    int fd = accept4(p->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0)
        return;
    if (p->c.state != S_IDLE) {
        logline("memif.refused", p->name, "reason=\"interface already has a client\" state=%d",
                (int)p->c.state);
        send_disconnect(fd, "interface already has a client");
        close(fd);
        return;
    }
    p->c.fd = fd;
    p->c.state = S_WAIT_INIT;
    p->c.deadline_ms = now_ms() + g_lim.handshake_ms;
    ev.data.u64 = tag(K_CLIENT, (int)(p - g_ports), 0);
    epoll_ctl(g_epoll, EPOLL_CTL_ADD, fd, &ev);
    send_hello(fd);
}

/* -- data path ---------------------------------------------------------------------------- */

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

/* How many buffers the client offers on its S2C ring now (0 when none, or the client is gone:
 * a bad head drops the client). */
static uint16_t s2c_free(struct port *p)
{
    struct ring *r;
    uint16_t free_slots;
    if (p->c.state != S_CONNECTED)
        return 0;
    r = &p->c.s2c[0];
    free_slots = (uint16_t)(load_idx(HEAD(r)) - r->last);
    if (free_slots > r->size) {
        refuse(p, "S2C ring head out of range");
        return 0;
    }
    return free_slots;
}

/* The client's buffer in S2C slot `r->last + ahead`, with its capacity; NULL for a descriptor
 * outside the client's regions. */
static uint8_t *s2c_slot_buffer(struct port *p, uint16_t ahead, uint32_t *capacity)
{
    struct ring *r = &p->c.s2c[0];
    struct desc d;
    read_desc(r, (uint16_t)(r->last + ahead), &d);
    *capacity = d.length;
    return buffer_of(&p->c, &d, d.length);
}

/* The next buffer the client offers on its S2C ring, with its capacity; NULL when none. */
static uint8_t *s2c_buffer(struct port *p, uint32_t *capacity)
{
    if (!s2c_free(p))
        return NULL;
    return s2c_slot_buffer(p, 0, capacity);
}

static void s2c_write_slot(struct port *p, uint16_t ahead, uint16_t flags, uint32_t length)
{
    struct ring *r = &p->c.s2c[0];
    uint16_t slot_index = (uint16_t)(r->last + ahead);
    uint8_t *slot = r->base + RING_HEADER + (size_t)(slot_index & (r->size - 1)) * DESC_SIZE;
    memcpy(slot, &flags, 2);
    memcpy(slot + 4, &length, 4);
}

/* The buffer s2c_buffer gave now holds a frame of `length` bytes. */
static void s2c_commit(struct port *p, uint32_t length)
{
    s2c_write_slot(p, 0, 0, length);
    p->c.s2c[0].last++;
    p->st.to_client++;
    p->pending = 1;
}

/* A frame into the client's S2C buffers, chained over as many as it needs (every descriptor
 * but the last flagged NEXT), as a NIC scatters a jumbo frame. All or nothing: the buffers are
 * checked before any is written, so a frame that does not fit leaves the ring as it was. Each
 * descriptor is read once: the client may rewrite its ring meanwhile, and what was checked is
 * what is used. A frame needing more than MAX_CHAIN buffers does not fit (with DPDK's 2 KiB
 * buffers the largest frame takes 32). Returns 1 when the frame is queued. */
#define MAX_CHAIN 64
static int s2c_put(struct port *p, const uint8_t *frame, uint32_t total)
{
    uint8_t *bufs[MAX_CHAIN];
    uint32_t sizes[MAX_CHAIN], done = 0;
    uint16_t free_slots = s2c_free(p), used = 0, i;
    while (done < total) {
        uint32_t capacity;
        if (used == free_slots || used == MAX_CHAIN)
            return 0;
        bufs[used] = s2c_slot_buffer(p, used, &capacity);
        if (!bufs[used] || !capacity)
            return 0;
        sizes[used] = total - done < capacity ? total - done : capacity;
        done += sizes[used++];
    }
    for (i = 0, done = 0; i < used; i++) {
        memcpy(bufs[i], frame + done, sizes[i]);
        done += sizes[i];
        s2c_write_slot(p, i, i + 1 < used ? DESC_FLAG_NEXT : 0, sizes[i]);
    }
    p->c.s2c[0].last = (uint16_t)(p->c.s2c[0].last + used);
    p->st.to_client++;
    p->pending = 1;
    return 1;
}

/* Publish the S2C tail and wake the client unless it asked not to be woken. */
static void s2c_flush(struct port *p)
{
    struct ring *r;
    uint16_t flags;
    if (!p->pending || p->c.state != S_CONNECTED)
        return;
    p->pending = 0;
    r = &p->c.s2c[0];
    store_idx(TAIL(r), r->last);
    memcpy(&flags, FLAGS(r), 2);
    if (!(flags & RING_FLAG_MASK_INT)) {
        uint64_t one = 1;
        if (write(r->efd, &one, sizeof(one)) < 0) {
            /* the client's counter is saturated: it will still see the tail */
        }
    }
}

/* The shared port a frame from `from` goes to ring to ring, or NULL (the kernel path). */
static struct port *shared_target(struct port *from, const uint8_t *frame)
{
    struct fdb_entry *e;
    struct port *to;
    if (!from->shared || (frame[0] & 1))
        return NULL;
    e = fdb_find(frame, from->domain);
    if (!e)
        return NULL;
    to = &g_ports[e->port];
    if (to == from || !to->used || !to->shared || to->domain != from->domain ||
        to->c.state != S_CONNECTED)
        return NULL;
    return to;
}

/* Count a drop on the port whose policy made it; 0. */
static int dropped(struct port *p, int verdict)
{
    if (verdict == V_SPOOFED)
        p->st.spoofed++;
    else if (verdict == V_DENIED)
        p->st.denied++;
    else if (verdict == V_INVALID)
        p->st.invalid++;
    else
        p->st.flows_full++;
    return 0;
}

/* Step 2 on a frame ring to ring: the sender's egress, the receiver's ingress, conntrack for
 * either that is stateful (one flow serves both); 1 when it may move. */
static int admit_ip(struct port *from, struct port *to, const struct pkt *pk)
{
    const struct classifier *out = from->cls, *in = to->cls;
    int tracked = (out && out->stateful) || (in && in->stateful), v;
    struct track k;
    k.state = CT_UNTRACKED;
    if (pk->malformed)
        return dropped(out ? from : to, V_INVALID);
    if (tracked)
        ct_lookup(from->domain, pk, &k);
    if (out && (v = judge(out, pk, 1, k.state)) != V_PASS)
        return dropped(from, v);
    if (in && (v = judge(in, pk, 0, k.state)) != V_PASS)
        return dropped(to, v);
    if (tracked && !ct_commit(from->domain, &k))
        return dropped(out && out->stateful ? from : to, V_FULL);
    return 1;
}

/* Whether a frame may move ring to ring between ports of which one at least is filtered;
 * `spoofed`: the sender's step 1 refused it. Counts the verdict. */
static int admit_shared(struct port *from, struct port *to, const struct pkt *pk, int spoofed)
{
    if (spoofed)
        return dropped(from, V_SPOOFED);
    if (pk->version && !admit_ip(from, to, pk))
        return 0;
    if (from->cls)
        from->st.admitted++;
    if (to->cls)
        to->st.admitted++;
    return 1;
}

/* One frame from `from`'s client, to another shared port's ring or to the tap. A receiver
 * with no free buffer loses the frame (counted as its ring_full), as a NIC's receive ring
 * overruns: the sender is never held back, so no receiver can stall it. A filtered sender's
 * source MAC is learned only from a frame its port security admits; frames ring to ring are
 * judged by the classifiers of both ports, frames to the tap by the kernel. An IP fragment
 * that either port's classifier would judge goes to the tap: the master reassembles nothing,
 * and a later fragment's bytes are payload, not ports. */
static void deliver(struct port *from, const uint8_t *frame, uint32_t total)
{
    struct port *to;
    struct pkt pk;
    int spoofed = 0;
    if (from->shared && from->cls) {
        parse_frame(frame, total, &pk);
        spoofed = !may_send(from->cls, &pk);
    }
    if (from->shared && !spoofed)
        fdb_learn(frame + 6, from->domain, (int)(from - g_ports));
    to = shared_target(from, frame);
    if (to && (from->cls || to->cls)) {
        if (!from->cls)
            parse_frame(frame, total, &pk);
        if (pk.fragment)
            to = NULL; /* the kernel's: the bridge reassembles it for nftables */
    }
    if (to) {
        if ((from->cls || to->cls) && !admit_shared(from, to, &pk, spoofed))
            return;
        if (s2c_put(to, frame, total))
            from->st.to_shared++;
        else
            to->st.ring_full++;
        return;
    }
    if (write(from->tap_fd, frame, total) == (ssize_t)total)
        from->st.to_kernel++;
    else
        from->st.kernel_drops++;
}

/* Client -> tap or another port's ring; counts the frames it moved into *work. NULL or a
 * reason to drop the client. A frame of a shared port whose domain has a classifier is copied
 * out of the client's memory before anything reads it (a chained one is assembled in g_scratch
 * anyway): the client can rewrite its buffer at any time, and what is judged and learned must
 * be what moves. Unfiltered domains keep the single copy, into the receiver's buffer. */
static const char *drain_c2s(struct port *p, struct ring *r, unsigned *work)
{
    struct conn *c = &p->c;
    uint16_t head = load_idx(HEAD(r));
    uint16_t avail = (uint16_t)(head - r->last);
    if (avail > r->size)
        return "C2S ring head out of range";
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
            p->st.bad++;
            continue;
        }
        p->st.from_client++;
        if (single && p->shared && g_domain_filters[p->domain]) {
            memcpy(g_scratch, single, total); /* judged, learned and moved from our copy */
            single = NULL;
        }
        deliver(p, single ? single : g_scratch, total);
        (*work)++;
    }
    store_idx(TAIL(r), r->last);
    return NULL;
}

static void flush_all(void)
{
    int i;
    for (i = 0; i < MAX_PORTS; i++)
        if (g_ports[i].pending)
            s2c_flush(&g_ports[i]);
}

static unsigned drain_port(struct port *p)
{
    unsigned i, work = 0;
    for (i = 0; i < p->c.nc2s && p->c.state == S_CONNECTED; i++) {
        const char *err = drain_c2s(p, &p->c.c2s[i], &work);
        if (err)
            refuse(p, err);
    }
    return work;
}

static unsigned on_c2s_interrupt(struct port *p, unsigned index)
{
    uint64_t count;
    if (p->c.state != S_CONNECTED || index >= p->c.nc2s)
        return 0;
    if (read(p->c.c2s[index].efd, &count, sizeof(count)) < 0 && errno != EAGAIN)
        return 0;
    return drain_port(p);
}

/* One frame from the tap into the client's next buffer, the part that does not fit into the
 * scratch buffer behind it (one read either way); a frame larger than the buffer then goes out
 * chained. Returns 0 when the tap had nothing. */
static int tap_to_client(struct port *p, uint8_t *buf, uint32_t capacity)
{
    uint32_t first = capacity < MAX_FRAME ? capacity : MAX_FRAME;
    struct iovec iov[2] = {{buf, first}, {g_scratch + first, MAX_FRAME - first}};
    ssize_t got;
    if (!capacity) { /* an empty buffer goes back empty, as before: it must not wedge the ring */
        s2c_commit(p, 0);
        return 1;
    }
    got = readv(p->tap_fd, iov, 2);
    if (got < 0)
        return 0;
    if ((uint32_t)got <= first) {
        s2c_commit(p, (uint32_t)got);
        return 1;
    }
    memcpy(g_scratch, buf, first);
    if (!s2c_put(p, g_scratch, (uint32_t)got) && p->c.state == S_CONNECTED)
        p->st.ring_full++;
    return 1;
}

/* Tap -> client: fill the buffers the client offers on its S2C ring; drop what does not fit.
 * Returns how many frames it read from the tap. */
static unsigned on_tap(struct port *p)
{
    unsigned n;
    for (n = 0; n < BATCH; n++) {
        uint32_t capacity = 0;
        uint8_t *buf = s2c_buffer(p, &capacity);
        if (!buf) {
            if (read(p->tap_fd, g_scratch, sizeof(g_scratch)) < 0)
                break;
            if (p->c.state == S_CONNECTED)
                p->st.ring_full++;
            continue;
        }
        if (!tap_to_client(p, buf, capacity))
            break;
    }
    s2c_flush(p);
    return n;
}

/* -- adaptive polling: spin briefly while traffic flows, sleep in epoll when idle ---------- */

/* Ask a client not to signal C2S frames (we are polling) or to signal them again. */
static void mask_c2s(struct port *p, int masked)
{
    unsigned i;
    for (i = 0; i < p->c.nc2s; i++) {
        uint16_t flags = masked ? RING_FLAG_MASK_INT : 0;
        __atomic_store_n((uint16_t *)FLAGS(&p->c.c2s[i]), flags, __ATOMIC_RELEASE);
    }
}

static void mask_all(int masked)
{
    int i;
    for (i = 0; i < MAX_PORTS; i++)
        if (g_ports[i].used && g_ports[i].c.state == S_CONNECTED)
            mask_c2s(&g_ports[i], masked);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

static unsigned drain_all(void)
{
    unsigned work = 0;
    int i;
    for (i = 0; i < MAX_PORTS; i++)
        if (g_ports[i].used && g_ports[i].c.state == S_CONNECTED)
            work += drain_port(&g_ports[i]);
    flush_all();
    return work;
}

static unsigned dispatch(uint64_t t);

/* What epoll has ready now (taps, sockets), without waiting; returns frames moved. */
static unsigned ready_now(int timeout)
{
    struct epoll_event evs[32];
    unsigned work = 0;
    int n = epoll_wait(g_epoll, evs, 32, timeout), i;
    g_now_ms = now_ms();
    for (i = 0; i < n; i++)
        work += dispatch(evs[i].data.u64);
    flush_all();
    return work;
}

/* After traffic: with the clients' C2S interrupts masked, poll their rings (and, through one
 * epoll_wait, the taps and sockets) until nothing moved for poll_us, at most SPIN_SLICE_US in
 * one go. A round that moved nothing yields the CPU: on a node where CNFs busy-poll, the master
 * must not keep a receiver from draining its ring. Returns 1 when the slice ended with traffic
 * still flowing (poll again at once), 0 when idle (sleep). */
#define SPIN_SLICE_US 2000
static int spin(void)
{
    long long start = now_us(), idle_until = start + g_lim.poll_us;
    if (g_lim.poll_us == 0)
        return 0;
    mask_all(1);
    while (!g_stop) {
        long long t;
        unsigned work = ready_now(0) + drain_all();
        t = now_us();
        if (work)
            idle_until = t + g_lim.poll_us;
        else if (t >= idle_until)
            break;
        else
            sched_yield();
        if (t - start >= SPIN_SLICE_US)
            return 1;
    }
    mask_all(0);
    /* frames that came while the masks were set, before the clients could see them cleared */
    return drain_all() > 0;
}

/* -- the agent's control socket --------------------------------------------------------- */

/* A NUL-terminated field of 1..size-1 characters, zeros after the terminator; `allow_any`
 * admits every printable character but space, otherwise only [A-Za-z0-9._-]. */
static int valid_name(const uint8_t *field, size_t size, char *out, int allow_any)
{
    size_t i, len = 0;
    while (len < size && field[len])
        len++;
    if (len == 0 || len == size)
        return 0;
    for (i = 0; i < len; i++) {
        uint8_t ch = field[i];
        int ok = allow_any ? (ch > 0x20 && ch < 0x7f)
                           : ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                              (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' || ch == '.');
        if (!ok)
            return 0;
    }
    for (i = len; i < size; i++)
        if (field[i])
            return 0;
    memcpy(out, field, len + 1);
    return 1;
}

static void reply(int fd, uint32_t status, const char *text)
{
    uint8_t rep[CTL_REP] = {0};
    put32(rep, status);
    if (text)
        strncpy((char *)rep + 4, text, CTL_REP - 5);
    send(fd, rep, CTL_REP, MSG_NOSIGNAL);
}

static struct port *port_named(const char *name)
{
    int i;
    for (i = 0; i < MAX_PORTS; i++)
        if (g_ports[i].used && strcmp(g_ports[i].name, name) == 0)
            return &g_ports[i];
    return NULL;
}

static int domain_of(const char *name)
{
    int i, free_slot = -1;
    for (i = 0; i < MAX_PORTS; i++) {
        if (g_domains[i][0] && strcmp(g_domains[i], name) == 0)
            return i;
        if (!g_domains[i][0] && free_slot < 0)
            free_slot = i;
    }
    /* every port has a domain, so there is always room for one more */
    strcpy(g_domains[free_slot], name);
    return free_slot;
}

static void release_domain(int domain)
{
    int i;
    for (i = 0; i < MAX_PORTS; i++)
        if (g_ports[i].used && g_ports[i].domain == domain)
            return;
    g_domains[domain][0] = 0;
    flows_forget_domain(domain); /* a network's flows go with its last port */
}

/* The tap a descriptor holds must be a tap of the port's name. */
static int tap_named(int fd, const char *name)
{
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    if (ioctl(fd, TUNGETIFF, &ifr) != 0)
        return 0;
    return (ifr.ifr_flags & IFF_TAP) && strncmp(ifr.ifr_name, name, IFNAMSIZ) == 0;
}

static int is_listener(int fd)
{
    int type = 0, listening = 0;
    socklen_t len = sizeof(type);
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_SEQPACKET)
        return 0;
    len = sizeof(listening);
    return getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && listening;
}

static const char *op_add(const uint8_t *m, const char *name, int *fds)
{
    char secret[SECRET_SIZE + 1], domain[PORT_NAME];
    struct epoll_event ev = {.events = EPOLLIN};
    struct port *p = NULL;
    uint32_t shared = get32(m + REQ_SHARED);
    int i;
    if (fds[0] < 0 || fds[1] < 0)
        return "add needs two descriptors: the memif socket and the tap";
    if (!valid_name(m + REQ_SECRET, SECRET_SIZE + 1, secret, 1) || !zeros(m + REQ_SECRET + SECRET_SIZE + 1, REQ_SECRET_SIZE - SECRET_SIZE - 1))
        return "secret must be 1-24 printable characters";
    if (!valid_name(m + REQ_DOMAIN, PORT_NAME, domain, 0))
        return "domain must be 1-15 characters of [A-Za-z0-9._-]";
    if (shared > 1)
        return "shared must be 0 or 1";
    if (m[REQ_MAC] & 1)
        return "mac must be a unicast address";
    if (port_named(name))
        return "a port of this name is served already";
    if (!is_listener(fds[0]))
        return "the first descriptor is not a listening SOCK_SEQPACKET socket";
    if (!tap_named(fds[1], name))
        return "the second descriptor is not the tap of this name";
    for (i = 0; i < MAX_PORTS && !p; i++)
        if (!g_ports[i].used)
            p = &g_ports[i];
    if (!p)
        return "no room for another port";
    memset(p, 0, sizeof(*p));
    p->used = 1;
    strcpy(p->name, name);
    strcpy(p->secret, secret);
    p->secret_len = strlen(secret);
    p->listen_fd = fds[0];
    p->tap_fd = fds[1];
    p->domain = domain_of(domain);
    p->shared = (int)shared;
    memcpy(p->mac, m + REQ_MAC, 6);
    p->c.fd = -1;
    if (p->shared)
        fdb_pin(p);
    fcntl(p->listen_fd, F_SETFL, fcntl(p->listen_fd, F_GETFL) | O_NONBLOCK);
    fcntl(p->tap_fd, F_SETFL, fcntl(p->tap_fd, F_GETFL) | O_NONBLOCK);
    ev.data.u64 = tag(K_LISTEN, (int)(p - g_ports), 0);
    epoll_ctl(g_epoll, EPOLL_CTL_ADD, p->listen_fd, &ev);
    ev.data.u64 = tag(K_TAP, (int)(p - g_ports), 0);
    epoll_ctl(g_epoll, EPOLL_CTL_ADD, p->tap_fd, &ev);
    set_carrier(p, 0);
    fds[0] = fds[1] = -1;
    logline("memif.port_added", p->name, "domain=%s path=%s", domain,
            shared ? "shared" : "kernel");
    return NULL;
}

static void remove_port(struct port *p)
{
    int domain = p->domain;
    if (p->c.state != S_IDLE)
        send_disconnect(p->c.fd, "port removed");
    drop_client(p);
    fdb_forget_port((int)(p - g_ports));
    epoll_ctl(g_epoll, EPOLL_CTL_DEL, p->listen_fd, NULL);
    epoll_ctl(g_epoll, EPOLL_CTL_DEL, p->tap_fd, NULL);
    close(p->listen_fd);
    close(p->tap_fd);
    logline("memif.port_removed", p->name, "from_client=%llu to_client=%llu",
            (unsigned long long)p->st.from_client, (unsigned long long)p->st.to_client);
    if (p->cls)
        g_domain_filters[domain]--;
    cls_free(p->cls);
    memset(p, 0, sizeof(*p));
    release_domain(domain);
}

static const char *op_path(const uint8_t *m, struct port *p)
{
    uint32_t shared = get32(m + REQ_SHARED);
    if (shared > 1)
        return "shared must be 0 or 1";
    if (p->shared && !shared)
        fdb_forget_port((int)(p - g_ports)); /* from now on nothing is delivered to it */
    if (p->shared != (int)shared)
        logline("memif.path", p->name, "path=%s", shared ? "shared" : "kernel");
    p->shared = (int)shared;
    if (p->shared)
        fdb_pin(p);
    return NULL;
}

/* The port's classifier from a sealed memfd: checked, copied, swapped in between two frames
 * (the old one freed). Refused: the port keeps the classifier it had. */
static const char *op_policy(const uint8_t *m, struct port *p, const int *fds)
{
    const int sealed = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE;
    struct classifier *c = NULL;
    struct stat st;
    const char *err;
    void *blob;
    int seals;
    if (!zeros(m + REQ_SECRET, CTL_REQ - REQ_SECRET))
        return "reserved bytes must be zero";
    if (fds[0] < 0 || fds[1] >= 0)
        return "policy needs one descriptor: a sealed memfd holding the classifier";
    if (fstat(fds[0], &st) != 0 || !S_ISREG(st.st_mode))
        return "the descriptor is not a memfd";
    seals = fcntl(fds[0], F_GET_SEALS);
    if (seals < 0 || (seals & sealed) != sealed)
        return "classifier memfd is not sealed against change (F_SEAL_SHRINK, F_SEAL_GROW, "
               "F_SEAL_WRITE)";
    if (st.st_size < CLS_HEADER || st.st_size > CLS_MAX_SIZE)
        return why("%zu bytes: not within the header's %d and MAX_SIZE = %d",
                   (size_t)st.st_size, CLS_HEADER, CLS_MAX_SIZE);
    blob = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fds[0], 0);
    if (blob == MAP_FAILED)
        return "cannot map the classifier memfd";
    err = cls_read(blob, (size_t)st.st_size, &c);
    munmap(blob, (size_t)st.st_size);
    if (err)
        return err;
    g_domain_filters[p->domain] += (c != NULL) - (p->cls != NULL);
    cls_free(p->cls);
    p->cls = c;
    if (c)
        logline("memif.policy", p->name,
                "filtered=1 stateful=%d macs=%u sources=%u lists=%u spans=%u ingress=%u "
                "egress=%u", c->stateful, c->nmacs, c->nsources, c->nlists, c->nspans, c->nin,
                c->nout);
    else
        logline("memif.policy", p->name, "filtered=0");
    return NULL;
}

static void op_list(int fd)
{
    int i;
    for (i = 0; i < MAX_PORTS; i++) {
        struct port *p = &g_ports[i];
        uint8_t rep[CTL_REP] = {0};
        const uint64_t *counters = (const uint64_t *)&p->st;
        unsigned k;
        if (!p->used)
            continue;
        put32(rep, ST_PORT);
        memcpy(rep + 4, p->name, PORT_NAME);
        memcpy(rep + 20, g_domains[p->domain], PORT_NAME);
        put32(rep + 36, (uint32_t)p->c.state);
        put32(rep + 40, (uint32_t)p->shared);
        put32(rep + 44, p->cls != NULL);
        for (k = 0; k < sizeof(p->st) / 8; k++)
            put64(rep + 48 + 8 * k, counters[k]);
        send(fd, rep, CTL_REP, MSG_NOSIGNAL);
    }
    reply(fd, ST_OK, NULL);
}

static void on_agent(int slot)
{
    uint8_t m[CTL_REQ];
    char name[PORT_NAME];
    int fds[2], eof, fd = g_agents[slot];
    const char *err = recv_exact(fd, m, CTL_REQ, fds, 2, &eof, "request is not 80 bytes");
    uint32_t op;
    struct port *p;
    if (err && !*err)
        return;
    if (eof) {
        epoll_ctl(g_epoll, EPOLL_CTL_DEL, fd, NULL);
        close(fd);
        g_agents[slot] = -1;
        return;
    }
    op = err ? 0 : get32(m);
    if (!err && !zeros(m + REQ_END, CTL_REQ - REQ_END))
        err = "reserved bytes must be zero";
    if (!err && op != OP_LIST && !valid_name(m + REQ_NAME, PORT_NAME, name, 0))
        err = "name must be 1-15 characters of [A-Za-z0-9._-]";
    if (!err && op != OP_ADD && op != OP_POLICY && (fds[0] >= 0 || fds[1] >= 0))
        err = "unexpected descriptor";
    if (!err) {
        if (op == OP_ADD) {
            err = op_add(m, name, fds);
        } else if (op == OP_LIST) {
            op_list(fd);
            return;
        } else if (op == OP_POLICY) {
            p = port_named(name);
            err = p ? op_policy(m, p, fds) : "no port of this name";
        } else if (op == OP_REMOVE || op == OP_PATH) {
            p = port_named(name);
            if (!p)
                err = "no port of this name";
            else if (op == OP_REMOVE)
                remove_port(p);
            else
                err = op_path(m, p);
        } else {
            err = "unknown op";
        }
    }
    if (fds[0] >= 0)
        close(fds[0]);
    if (fds[1] >= 0)
        close(fds[1]);
    if (err)
        logline("memif.control_refused", "-", "reason=\"%s\" op=%u", err, op);
    reply(fd, err ? ST_ERROR : ST_OK, err);
}

static void on_control_accept(void)
{
    struct epoll_event ev = {.events = EPOLLIN};
    int fd = accept4(g_control, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK), i;
    if (fd < 0)
        return;
    for (i = 0; i < MAX_AGENTS; i++) {
        if (g_agents[i] < 0) {
            g_agents[i] = fd;
            ev.data.u64 = tag(K_AGENT, i, 0);
            epoll_ctl(g_epoll, EPOLL_CTL_ADD, fd, &ev);
            return;
        }
    }
    reply(fd, ST_ERROR, "too many control connections");
    close(fd);
}

/* -- main loop ---------------------------------------------------------------------------- */

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
        if (parse_limit(argv[i], "--control-fd", 0, 65535, &v))
            g_control = (int)v;
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
        else if (parse_limit(argv[i], "--max-flows", 1, 1u << 24, &v))
            g_max_flows = (uint32_t)v;
        else {
            fprintf(stderr, "podwire-memif: unknown argument %s\n", argv[i]);
            exit(2);
        }
    }
}

/* The nearest handshake deadline as an epoll timeout (ms); refuses clients past theirs. */
static int handshake_timeout(int timeout)
{
    long long now = now_ms();
    int i;
    for (i = 0; i < MAX_PORTS; i++) {
        struct port *p = &g_ports[i];
        long long left;
        if (!p->used || (p->c.state != S_WAIT_INIT && p->c.state != S_SETUP))
            continue;
        left = p->c.deadline_ms - now;
        if (left <= 0) {
            refuse(p, "handshake not finished in time");
            continue;
        }
        if (timeout < 0 || left < timeout)
            timeout = (int)left;
    }
    return timeout;
}

static unsigned dispatch(uint64_t t)
{
    int kind = (int)(t & 0xff), index = (int)((t >> 8) & 0xffff);
    unsigned ring = (unsigned)(t >> 24);
    struct port *p = index < MAX_PORTS ? &g_ports[index] : NULL;
    unsigned work = 0;
    if (kind == K_CONTROL)
        on_control_accept();
    else if (kind == K_AGENT && index < MAX_AGENTS && g_agents[index] >= 0)
        on_agent(index);
    else if (!p || !p->used)
        return 0;
    else if (kind == K_LISTEN)
        on_accept(p);
    else if (kind == K_CLIENT && p->c.fd >= 0)
        on_client(p);
    else if (kind == K_TAP)
        work = on_tap(p);
    else if (kind == K_C2S)
        work = on_c2s_interrupt(p, ring);
    return work;
}

int main(int argc, char **argv)
{
    int busy = 0, i;
    struct epoll_event ev = {.events = EPOLLIN};
    struct sigaction sa = {0};
    parse_args(argc, argv);
    if (g_control < 0 || !is_listener(g_control)) {
        fprintf(stderr, "podwire-memif: --control-fd must name a listening SOCK_SEQPACKET "
                        "socket\n");
        return 2;
    }
    fcntl(g_control, F_SETFL, fcntl(g_control, F_GETFL) | O_NONBLOCK);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stderr, NULL, _IOLBF, 0);
    for (i = 0; i < MAX_AGENTS; i++)
        g_agents[i] = -1;
    for (i = 0; i < FDB_SIZE; i++)
        g_fdb[i].port = -1;
    flows_init();
    g_epoll = epoll_create1(EPOLL_CLOEXEC);
    ev.data.u64 = tag(K_CONTROL, 0, 0);
    epoll_ctl(g_epoll, EPOLL_CTL_ADD, g_control, &ev);
    logline("memif.listening", "-",
            "max_regions=%u max_rings=%u max_log2_ring=%u poll_us=%u max_flows=%u "
            "flow_table_bytes=%zu", g_lim.max_regions, g_lim.max_rings, g_lim.max_log2_ring,
            g_lim.poll_us, g_max_flows, flows_bytes());
    while (!g_stop) {
        unsigned work = ready_now(handshake_timeout(busy ? 0 : -1));
        busy = (work || busy) ? spin() : 0;
    }
    for (i = 0; i < MAX_PORTS; i++)
        if (g_ports[i].used) {
            if (g_ports[i].c.state != S_IDLE)
                send_disconnect(g_ports[i].c.fd, "master stopping");
            remove_port(&g_ports[i]);
        }
    logline("memif.stopped", "-", "");
    return 0;
}
