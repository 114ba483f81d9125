/*
 * mpi_groups: a job with several communicators, as hierarchical and tensor/pipeline-parallel
 * jobs have. With --per-node P (ranks 0..P-1 on the first node, P..2P-1 on the next, as
 * mpirun maps by slot):
 *   node = MPI_Comm_split(world, color rank / P)   the ranks of one node
 *   rail = MPI_Comm_split(world, color rank % P)   one rank of each node (cross-node)
 *   pair = MPI_Comm_dup(rail)                      the same ranks, another communicator
 * Each step: MPI_Allreduce of --bytes on node, then on rail, then on pair, then an
 * MPI_Barrier on world. MPI_Comm_rank/size are asked on every sub-communicator, as
 * applications do.
 *
 * Output:
 *   init rank=R nranks=N pid=P node_rank=.. node_size=.. rail_rank=.. rail_size=..
 *   summary tool=mpi_groups rank=R steps=S bad=E
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage[] = "usage: mpirun ... mpi_groups --per-node P [--steps S] [--bytes B]\n";

static size_t check(const float* v, size_t n, float want) {
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += v[i] != want;
  return bad;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, nranks;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  long steps = 10, bytes = 1 << 16, per_node = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--steps")) steps = strtol(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--bytes")) bytes = strtol(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--per-node")) per_node = strtol(argv[i + 1], NULL, 10);
    else {
      fputs(usage, stderr);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  if (per_node <= 0 || nranks % per_node != 0 || bytes < 4) {
    fprintf(stderr, "mpi_groups: --per-node must divide %d ranks and --bytes be >= 4\n%s", nranks, usage);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  MPI_Comm node, rail, pair;
  MPI_Comm_split(MPI_COMM_WORLD, (int)(rank / per_node), rank, &node);
  MPI_Comm_split(MPI_COMM_WORLD, (int)(rank % per_node), rank, &rail);
  MPI_Comm_dup(rail, &pair);
  int node_rank, node_size, rail_rank, rail_size, pair_rank, pair_size;
  MPI_Comm_rank(node, &node_rank);
  MPI_Comm_size(node, &node_size);
  MPI_Comm_rank(rail, &rail_rank);
  MPI_Comm_size(rail, &rail_size);
  MPI_Comm_rank(pair, &pair_rank);
  MPI_Comm_size(pair, &pair_size);
  printf("init rank=%d nranks=%d pid=%d node_rank=%d node_size=%d rail_rank=%d rail_size=%d\n", rank, nranks, (int)getpid(),
         node_rank, node_size, rail_rank, rail_size);
  size_t count = (size_t)bytes / sizeof(float);
  float* send = malloc(count * sizeof(float));
  float* recv = malloc(count * sizeof(float));
  if (send == NULL || recv == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
  size_t bad = 0;
  for (long k = 0; k < steps; k++) {
    for (size_t i = 0; i < count; i++) send[i] = 1.0f;
    MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, node);
    bad += check(recv, count, (float)node_size);
    MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, rail);
    bad += check(recv, count, (float)rail_size);
    MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, pair);
    bad += check(recv, count, (float)pair_size);
    MPI_Barrier(MPI_COMM_WORLD);
  }
  printf("summary tool=mpi_groups rank=%d steps=%ld bad=%zu\n", rank, steps, bad);
  MPI_Comm_free(&pair);
  MPI_Comm_free(&rail);
  MPI_Comm_free(&node);
  MPI_Finalize();
  return bad ? 3 : 0;
}
