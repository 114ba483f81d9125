/*
 * ethtool_fixture.so — an LD_PRELOAD stand-in for a ConnectX driver's `ethtool -S`, for tests
 * on machines without mlx5 hardware (this one has none: PFC, ECN-per-priority and pause
 * counters exist only in mlx5's driver statistics).
 *
 * It fakes the kernel interface, not the agent: SIOCETHTOOL requests for an interface that
 * has a file $STEPWISE_ETHTOOL_FIXTURE/<ifname> are answered from that file, laid out as the
 * kernel lays them out (struct ethtool_drvinfo, ethtool_sset_info, ethtool_gstrings,
 * ethtool_stats in include/uapi/linux/ethtool.h); every other ioctl goes to the real one.
 * The file holds `name value` lines in string-table order, as `ethtool -S` prints them, and
 * is re-read on every request, so a test can evolve the counters (write a new file, rename).
 *
 *   cc -shared -fPIC -O2 -o libethtool_fixture.so ethtool_fixture.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <net/if.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>

#define SIOCETHTOOL 0x8946
#define ETHTOOL_GDRVINFO 0x03
#define ETHTOOL_GSTRINGS 0x1b
#define ETHTOOL_GSTATS 0x1d
#define ETHTOOL_GSSET_INFO 0x37
#define ETH_SS_STATS 1
#define ETH_GSTRING_LEN 32
#define MAX_STATS 512

struct table {
    int n;
    char names[MAX_STATS][ETH_GSTRING_LEN];
    uint64_t values[MAX_STATS];
};

/* Reads the fixture of `ifname`; 0 if there is none (then the real ioctl answers). */
static int load(const char *ifname, struct table *t) {
    const char *dir = getenv("STEPWISE_ETHTOOL_FIXTURE");
    if (!dir || !*dir || strchr(ifname, '/'))
        return 0;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, ifname);
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    char line[256];
    t->n = 0;
    while (t->n < MAX_STATS && fgets(line, sizeof line, f)) {
        char name[ETH_GSTRING_LEN + 1];
        unsigned long long v;
        if (sscanf(line, "%32s %llu", name, &v) != 2)
            continue;
        memset(t->names[t->n], 0, ETH_GSTRING_LEN);
        memcpy(t->names[t->n], name, strnlen(name, ETH_GSTRING_LEN));
        t->values[t->n] = v;
        t->n++;
    }
    fclose(f);
    return 1;
}

static int answer(struct ifreq *ifr) {
    static __thread struct table t;
    if (!load(ifr->ifr_name, &t))
        return -2;
    unsigned char *d = (unsigned char *)ifr->ifr_data;
    uint32_t cmd;
    memcpy(&cmd, d, 4);
    uint32_t n = (uint32_t)t.n;
    switch (cmd) {
    case ETHTOOL_GDRVINFO: /* struct ethtool_drvinfo: 196 bytes, n_stats at 180 */
        memset(d + 4, 0, 192);
        strcpy((char *)d + 4, "mlx5_core");
        strcpy((char *)d + 36, "fixture");
        memcpy(d + 180, &n, 4);
        return 0;
    case ETHTOOL_GSSET_INFO: { /* u32 cmd, reserved; u64 sset_mask; u32 data[] */
        uint64_t mask;
        memcpy(&mask, d + 8, 8);
        mask &= 1ull << ETH_SS_STATS;
        memcpy(d + 8, &mask, 8);
        if (mask)
            memcpy(d + 16, &n, 4);
        return 0;
    }
    case ETHTOOL_GSTRINGS: { /* u32 cmd, string_set, len; u8 data[len * 32] */
        uint32_t set;
        memcpy(&set, d + 4, 4);
        if (set != ETH_SS_STATS) {
            errno = EOPNOTSUPP;
            return -1;
        }
        memcpy(d + 8, &n, 4);
        memcpy(d + 12, t.names, (size_t)n * ETH_GSTRING_LEN);
        return 0;
    }
    case ETHTOOL_GSTATS: /* u32 cmd, n_stats; u64 data[n_stats] */
        memcpy(d + 4, &n, 4);
        memcpy(d + 8, t.values, (size_t)n * 8);
        return 0;
    default:
        errno = EOPNOTSUPP;
        return -1;
    }
}

int ioctl(int fd, unsigned long request, ...) {
    static int (*real)(int, unsigned long, ...);
    va_list ap;
    va_start(ap, request);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    if (request == SIOCETHTOOL && arg) {
        int r = answer((struct ifreq *)arg);
        if (r != -2)
            return r;
    }
    if (!real)
        real = (int (*)(int, unsigned long, ...))dlsym(RTLD_NEXT, "ioctl");
    return real(fd, request, arg);
}
