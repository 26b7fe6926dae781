/* Baseline unicast topic-resolution relay in C, for bench/relay.py.
 *
 * Same semantics as lbmrd's relay path (no NAT, no fill-in, no TTL):
 *   - one UDP socket bound to 127.0.0.1:PORT (PORT 0 = ephemeral), receive and
 *     send buffers of 1 MiB like lbmrd's defaults;
 *   - every valid datagram registers its source address (table of at most
 *     MAX_CLIENTS distinct ip:port, open-addressing hash for the look-up);
 *   - keepalives (packet types 2 and 3) are answered with the 4-byte
 *     (byte0 & 0xF0) 00 00 00 to the sender;
 *   - a type-0 packet without records is a resolver keepalive: nothing sent;
 *   - any other valid datagram is sent to every other registered client with
 *     sendmmsg(2), batches of at most 1024 messages sharing one iovec; a full
 *     send buffer (EAGAIN) waits up to 50 ms for room, then drops the rest.
 *
 * Validation is lighter than lbmrd's (header, TQR names; TIRs and packet
 * options are not walked), which only favours this baseline.
 *
 * Usage: relay_c [--port P] [--seconds S]
 * stdout: {"port": P} once bound; one counters line (JSON) on SIGUSR1; a
 * final counters line on SIGTERM/SIGINT or after S seconds, then exit 0.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_CLIENTS 4096
#define HASH_SLOTS 8192 /* power of two, > 2 * MAX_CLIENTS */
#define BATCH 1024
#define MAX_NAME_LEN 256
#define WRITE_WAIT_MS 50
#define BUF_BYTES (1 << 20)
#define HDR_OPTIONS_FLAG 0x08 /* byte 0: packet-options trailer present */

static volatile sig_atomic_t stop_flag = 0;
static volatile sig_atomic_t dump_flag = 0;

static struct sockaddr_in clients[MAX_CLIENTS];
static struct mmsghdr msgs[MAX_CLIENTS];
static int nclients = 0;
static int32_t slots[HASH_SLOTS]; /* index + 1, 0 = empty */

static struct iovec shared_iov;

static unsigned long long c_in, c_out, c_relayed, c_replies, c_quiet, c_malformed, c_table_full,
    c_send_full, c_send_errors, c_recv_errors;

static void on_signal(int sig) {
    if (sig == SIGUSR1)
        dump_flag = 1;
    else
        stop_flag = 1;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void print_counters(const char *why) {
    printf("{\"why\": \"%s\", \"t\": %.6f, \"clients\": %d, \"in\": %llu, \"out\": %llu, "
           "\"relayed\": %llu, \"replies\": %llu, \"quiet\": %llu, \"malformed\": %llu, "
           "\"table_full\": %llu, \"send_buffer_full\": %llu, \"send_errors\": %llu, "
           "\"recv_errors\": %llu}\n",
           why, now_s(), nclients, c_in, c_out, c_relayed, c_replies, c_quiet, c_malformed,
           c_table_full, c_send_full, c_send_errors, c_recv_errors);
    fflush(stdout);
}

static uint32_t hash_addr(const struct sockaddr_in *a) {
    uint64_t k = ((uint64_t)a->sin_addr.s_addr << 16) | a->sin_port;
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return (uint32_t)k & (HASH_SLOTS - 1);
}

/* Index of the client with this address, registering it if new; -1 if full. */
static int lookup_or_add(const struct sockaddr_in *a, int *added) {
    uint32_t h = hash_addr(a);
    *added = 0;
    for (int probes = 0; probes < HASH_SLOTS; probes++) {
        int32_t s = slots[h];
        if (s == 0) {
            if (nclients >= MAX_CLIENTS)
                return -1;
            int i = nclients++;
            memset(&clients[i], 0, sizeof clients[i]);
            clients[i].sin_family = AF_INET;
            clients[i].sin_addr = a->sin_addr;
            clients[i].sin_port = a->sin_port;
            memset(&msgs[i], 0, sizeof msgs[i]);
            msgs[i].msg_hdr.msg_name = &clients[i];
            msgs[i].msg_hdr.msg_namelen = sizeof clients[i];
            msgs[i].msg_hdr.msg_iov = &shared_iov;
            msgs[i].msg_hdr.msg_iovlen = 1;
            slots[h] = i + 1;
            *added = 1;
            return i;
        }
        const struct sockaddr_in *c = &clients[s - 1];
        if (c->sin_addr.s_addr == a->sin_addr.s_addr && c->sin_port == a->sin_port)
            return s - 1;
        h = (h + 1) & (HASH_SLOTS - 1);
    }
    return -1;
}

/* 0 = malformed, 1 = keepalive (reply), 2 = quiet, 3 = relay */
static int classify(const unsigned char *d, size_t n) {
    if (n < 4)
        return 0;
    unsigned version = d[0] >> 4, ptype = d[0] & 7, b1 = d[1];
    unsigned b23 = ((unsigned)d[2] << 8) | d[3];
    if (ptype > 3 || version > 1)
        return 3;
    if (ptype >= 2)
        return (b1 || b23) ? 0 : 1;
    if (ptype == 0) {
        size_t p = 4;
        for (unsigned i = 0; i < b1; i++) {
            const unsigned char *nul = memchr(d + p, 0, n - p);
            if (nul == NULL || (size_t)(nul - (d + p)) >= MAX_NAME_LEN)
                return 0;
            p = (size_t)(nul - d) + 1;
        }
        if (b1 == 0 && b23 == 0)
            return (d[0] & HDR_OPTIONS_FLAG) || p == n ? 2 : 0;
        if (b23 == 0 && !(d[0] & HDR_OPTIONS_FLAG) && p != n)
            return 0;
    }
    return 3;
}

/* Send the shared iovec to clients [start, stop). */
static void send_range(int fd, int start, int stop, double deadline) {
    while (start < stop) {
        int count = stop - start;
        if (count > BATCH)
            count = BATCH;
        int r = sendmmsg(fd, &msgs[start], (unsigned)count, MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS) {
                struct pollfd pf = {.fd = fd, .events = POLLOUT};
                int pr = poll(&pf, 1, WRITE_WAIT_MS);
                if (pr > 0)
                    continue;
                c_send_full += (unsigned long long)(stop - start);
                return;
            }
            c_send_errors++;
            start++; /* skip the failing destination */
            continue;
        }
        c_out += (unsigned long long)r;
        c_relayed += (unsigned long long)r;
        start += r;
        if (now_s() > deadline)
            return;
    }
}

int main(int argc, char **argv) {
    int port = 0;
    double seconds = 600.0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--port") && i + 1 < argc)
            port = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
            seconds = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--port P] [--seconds S]\n", argv[0]);
            return 2;
        }
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: poll returns EINTR */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);

    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (fd < 0) {
        perror("socket");
        return 3;
    }
    int bufsz = BUF_BYTES;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bufsz, sizeof bufsz);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bufsz, sizeof bufsz);
    struct sockaddr_in me;
    memset(&me, 0, sizeof me);
    me.sin_family = AF_INET;
    me.sin_port = htons((uint16_t)port);
    me.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&me, sizeof me) < 0) {
        perror("bind");
        return 3;
    }
    socklen_t ml = sizeof me;
    getsockname(fd, (struct sockaddr *)&me, &ml);
    printf("{\"port\": %d}\n", ntohs(me.sin_port));
    fflush(stdout);

    double end = now_s() + seconds;
    static unsigned char buf[65536];
    while (!stop_flag) {
        if (dump_flag) {
            dump_flag = 0;
            print_counters("usr1");
        }
        double left = end - now_s();
        if (left <= 0)
            break;
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int pr = poll(&pf, 1, left > 0.1 ? 100 : (int)(left * 1000) + 1);
        if (pr <= 0)
            continue; /* timeout or EINTR: re-check the flags and the clock */
        /* drain the socket, at most 4096 datagrams before re-checking flags */
        for (int k = 0; k < 4096 && !stop_flag; k++) {
            struct sockaddr_in src;
            socklen_t sl = sizeof src;
            ssize_t n = recvfrom(fd, buf, sizeof buf, MSG_DONTWAIT, (struct sockaddr *)&src, &sl);
            if (n < 0) {
                if (errno == EAGAIN || errno == EWOULDBLOCK)
                    break;
                if (errno != EINTR)
                    c_recv_errors++;
                continue;
            }
            if (src.sin_family != AF_INET)
                continue;
            int kind = classify(buf, (size_t)n);
            if (kind == 0) {
                c_malformed++;
                continue;
            }
            int added;
            int me_i = lookup_or_add(&src, &added);
            if (me_i < 0) {
                c_table_full++;
                continue;
            }
            c_in++;
            if (kind == 1) {
                unsigned char rep[4] = {(unsigned char)(buf[0] & 0xF0), 0, 0, 0};
                if (sendto(fd, rep, 4, MSG_DONTWAIT, (struct sockaddr *)&src, sl) == 4) {
                    c_out++;
                    c_replies++;
                } else {
                    c_send_errors++;
                }
            } else if (kind == 2) {
                c_quiet++;
            } else {
                shared_iov.iov_base = buf;
                shared_iov.iov_len = (size_t)n;
                double deadline = now_s() + 5.0;
                send_range(fd, 0, me_i, deadline);
                send_range(fd, me_i + 1, nclients, deadline);
            }
        }
    }
    print_counters(stop_flag ? "signal" : "time limit");
    close(fd);
    return 0;
}
