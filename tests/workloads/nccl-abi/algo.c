/*
 * Collective algorithms over the proxy's point-to-point transfers. Each ring step sends
 * one segment to the next rank and receives one from the previous rank concurrently.
 *
 * Flat ring: ranks in rank order, so with ranks 0..L-1 on host A and L..2L-1 on host B
 * only two edges cross hosts, each from one NIC (the rail-imbalance scenario).
 * Hierarchical: reduce-scatter inside each host, all-reduce of each shard across hosts
 * between the ranks with the same local index (the same rail), all-gather inside each
 * host; every rail carries 1/L of the cross-host bytes.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static int mod(int a, int n) { return ((a % n) + n) % n; }

void seg_split(size_t count, int n, int i, size_t* off, size_t* cnt) {
  size_t base = count / (size_t)n, rem = count % (size_t)n, ui = (size_t)i;
  *cnt = base + (ui < rem ? 1 : 0);
  *off = ui * base + (ui < rem ? ui : rem);
}

ncclResult_t ring_reduce_scatter(struct ncclComm* comm, const struct group* g, char* buf,
                                 size_t count, ncclDataType_t dt, ncclRedOp_t op) {
  int n = g->n, p = g->pos;
  if (n == 1) return ncclSuccess;
  size_t es = abi_type_size(dt), off, max;
  seg_split(count, n, 0, &off, &max);
  char* tmp = malloc(max * es + 1);
  if (tmp == NULL) return ncclSystemError;
  ncclResult_t rc = ncclSuccess;
  /* At step s position p sends segment p-s-1 and folds segment p-s-2 into its buffer;
   * after n-1 steps it holds segment p reduced over the whole group. */
  for (int s = 0; s < n - 1 && rc == ncclSuccess; s++) {
    size_t soff, scnt, roff, rcnt;
    seg_split(count, n, mod(p - s - 1, n), &soff, &scnt);
    seg_split(count, n, mod(p - s - 2, n), &roff, &rcnt);
    struct xfer x[2] = {
        {g->ranks[mod(p + 1, n)], 1, buf + soff * es, scnt * es, NULL},
        {g->ranks[mod(p - 1, n)], 0, tmp, rcnt * es, NULL},
    };
    rc = comm_run(comm, x, 2);
    if (rc == ncclSuccess) reduce_into(buf + roff * es, tmp, rcnt, dt, op);
  }
  free(tmp);
  return rc;
}

ncclResult_t ring_all_gather(struct ncclComm* comm, const struct group* g, char* buf,
                             size_t count, ncclDataType_t dt) {
  int n = g->n, p = g->pos;
  size_t es = abi_type_size(dt);
  ncclResult_t rc = ncclSuccess;
  for (int s = 0; s < n - 1 && rc == ncclSuccess; s++) {
    size_t soff, scnt, roff, rcnt;
    seg_split(count, n, mod(p - s, n), &soff, &scnt);
    seg_split(count, n, mod(p - s - 1, n), &roff, &rcnt);
    struct xfer x[2] = {
        {g->ranks[mod(p + 1, n)], 1, buf + soff * es, scnt * es, NULL},
        {g->ranks[mod(p - 1, n)], 0, buf + roff * es, rcnt * es, NULL},
    };
    rc = comm_run(comm, x, 2);
  }
  return rc;
}

static ncclResult_t group_world(struct ncclComm* comm, struct group* g) {
  g->n = comm->nranks;
  g->pos = comm->rank;
  g->ranks = malloc(sizeof(int) * (size_t)g->n);
  if (g->ranks == NULL) return ncclSystemError;
  for (int r = 0; r < g->n; r++) g->ranks[r] = r;
  return ncclSuccess;
}

/* Local group: the ranks on this host in rank order. Rail group: the ranks with this
 * rank's local index, one per host, in host order. */
static ncclResult_t group_hier(struct ncclComm* comm, struct group* local,
                               struct group* rail) {
  int me = comm->rank, myhost = comm->host_of[me];
  local->ranks = malloc(sizeof(int) * (size_t)comm->local_size);
  rail->ranks = malloc(sizeof(int) * (size_t)comm->nhosts);
  if (!local->ranks || !rail->ranks) return ncclSystemError;
  local->n = 0;
  for (int r = 0; r < comm->nranks; r++)
    if (comm->host_of[r] == myhost) {
      if (r == me) local->pos = local->n;
      local->ranks[local->n++] = r;
    }
  rail->n = comm->nhosts;
  rail->pos = myhost;
  for (int h = 0; h < comm->nhosts; h++) {
    int idx = 0;
    for (int r = 0; r < comm->nranks; r++)
      if (comm->host_of[r] == h && idx++ == local->pos) rail->ranks[h] = r;
  }
  return ncclSuccess;
}

ncclResult_t algo_all_reduce(struct ncclComm* comm, char* buf, size_t count,
                             ncclDataType_t dt, ncclRedOp_t op) {
  struct group world = {0}, local = {0}, rail = {0};
  ncclResult_t rc;
  if (!comm->algo_hier || comm->nhosts == 1 || comm->local_size == 1) {
    rc = group_world(comm, &world);
    if (rc == ncclSuccess) rc = ring_reduce_scatter(comm, &world, buf, count, dt, op);
    if (rc == ncclSuccess) rc = ring_all_gather(comm, &world, buf, count, dt);
  } else {
    rc = group_hier(comm, &local, &rail);
    size_t off, cnt, es = abi_type_size(dt);
    seg_split(count, local.n, local.pos, &off, &cnt);
    if (rc == ncclSuccess) rc = ring_reduce_scatter(comm, &local, buf, count, dt, op);
    if (rc == ncclSuccess) rc = ring_reduce_scatter(comm, &rail, buf + off * es, cnt, dt, op);
    if (rc == ncclSuccess) rc = ring_all_gather(comm, &rail, buf + off * es, cnt, dt);
    if (rc == ncclSuccess) rc = ring_all_gather(comm, &local, buf, count, dt);
  }
  if (rc == ncclSuccess && op == ncclAvg) scale_avg(buf, count, dt, comm->nranks);
  free(world.ranks);
  free(local.ranks);
  free(rail.ranks);
  return rc;
}

/* Reduce: ring reduce-scatter, then every rank sends its reduced segment to the root. */
ncclResult_t algo_reduce(struct ncclComm* comm, char* buf, size_t count, ncclDataType_t dt,
                         ncclRedOp_t op, int root) {
  struct group world;
  ncclResult_t rc = group_world(comm, &world);
  if (rc == ncclSuccess) rc = ring_reduce_scatter(comm, &world, buf, count, dt, op);
  int n = comm->nranks;
  size_t es = abi_type_size(dt), off, cnt;
  struct xfer* x = calloc((size_t)n, sizeof *x);
  if (rc == ncclSuccess && x == NULL) rc = ncclSystemError;
  if (rc == ncclSuccess) {
    int k = 0;
    if (comm->rank == root) {
      for (int r = 0; r < n; r++) {
        if (r == root) continue;
        seg_split(count, n, r, &off, &cnt);
        x[k++] = (struct xfer){r, 0, buf + off * es, cnt * es, NULL};
      }
    } else {
      seg_split(count, n, comm->rank, &off, &cnt);
      x[k++] = (struct xfer){root, 1, buf + off * es, cnt * es, NULL};
    }
    rc = comm_run(comm, x, k);
  }
  if (rc == ncclSuccess && op == ncclAvg && comm->rank == root)
    scale_avg(buf, count, dt, comm->nranks);
  free(x);
  free(world.ranks);
  return rc;
}

/* Broadcast: a pipelined chain in ring order starting at the root, 1 MiB pieces. */
ncclResult_t algo_broadcast(struct ncclComm* comm, char* buf, size_t bytes, int root) {
  int n = comm->nranks;
  if (n == 1) return ncclSuccess;
  const size_t piece = 1 << 20;
  long npieces = (long)((bytes + piece - 1) / piece);
  int d = mod(comm->rank - root, n);
  int next = mod(comm->rank + 1, n), prev = mod(comm->rank - 1, n);
  ncclResult_t rc = ncclSuccess;
  /* At step t the rank at distance d receives piece t-d+1 and forwards piece t-d. */
  for (long t = 0; t < npieces + n - 2 && rc == ncclSuccess; t++) {
    struct xfer x[2];
    int k = 0;
    long ps = t - d, pr = t - d + 1;
    if (d < n - 1 && ps >= 0 && ps < npieces) {
      size_t o = (size_t)ps * piece;
      x[k++] = (struct xfer){next, 1, buf + o, bytes - o < piece ? bytes - o : piece, NULL};
    }
    if (d > 0 && pr >= 0 && pr < npieces) {
      size_t o = (size_t)pr * piece;
      x[k++] = (struct xfer){prev, 0, buf + o, bytes - o < piece ? bytes - o : piece, NULL};
    }
    rc = comm_run(comm, x, k);
  }
  return rc;
}
