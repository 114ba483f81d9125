/*
 * mpi_steps: a training loop over MPI. Each step is compute (a busy-wait) followed by one
 * MPI_Allreduce of --bytes (float sum over MPI_COMM_WORLD), bracketed by step markers.
 * --delay-rank R --delay-us D --delay-every K: rank R computes D us longer on every K-th
 * step, so the others wait for it inside MPI_Allreduce (readiness skew of D).
 * --stop-rank R --stop-step K: rank R stops itself (SIGSTOP) just before step K's
 * MPI_Allreduce. --vary-us V: at step k rank k % 4 computes 0..V longer (a pseudo-random
 * amount per step): step times vary and the others wait up to V, progressing.
 * --start-at-us T --period-us P: step k's MPI_Allreduce is issued at CLOCK_MONOTONIC
 * T + k*P us at the earliest (the compute waits for it): jobs given one T stay in phase.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "stepcommon.h"

static const char usage[] =
    "usage: mpirun ... mpi_steps [--steps S] [--bytes B] [--compute-us C]\n"
    "                  [--marker-socket PATH] [--delay-rank R --delay-us D [--delay-every K]]\n"
    "                  [--no-verify] [--stop-rank R --stop-step K] [--vary-us V]\n"
    "                  [--start-at-us T --period-us P]\n"
    "  Steps of C us busy-wait + one MPI_Allreduce of B bytes (float sum).\n";

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, nranks;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  struct step_opts o;
  step_parse(argc, argv, &o, 0, usage);
  setvbuf(stdout, NULL, _IOLBF, 0);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  printf("init rank=%d nranks=%d pid=%d\n", rank, nranks, (int)getpid());

  size_t count = o.bytes / sizeof(float);
  float* send = malloc(o.bytes);
  float* recv = malloc(o.bytes);
  if (send == NULL || recv == NULL) {
    perror("malloc");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  struct markers m;
  markers_open(&m, o.marker_socket);
  struct step_stats st;
  stats_init(&st, o.steps);
  size_t errors = 0;
  for (long k = 0; k < o.steps; k++) {
    fill_input(send, count, rank, k);
    long delay = step_delay_us(&o, rank, k);
    marker_send(&m, rank, k, "begin");
    double t0 = now_us();
    busy_wait_us(o.compute_us + delay);
    step_pace(&o, k);
    step_stop_point(&o, rank, k);
    double t1 = now_us();
    int rc = MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double t2 = now_us();
    marker_send(&m, rank, k, "end");
    if (rc != MPI_SUCCESS) {
      char msg[MPI_MAX_ERROR_STRING];
      int len = 0;
      MPI_Error_string(rc, msg, &len);
      fprintf(stderr, "mpi_steps rank %d step %ld: MPI_Allreduce failed: %s\n", rank, k, msg);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    size_t bad = o.verify ? check_sum(recv, count, nranks, k) : 0;
    errors += bad;
    st.comm_us[st.n] = t2 - t1;
    st.step_us[st.n++] = t2 - t0;
    printf("step rank=%d step=%ld compute_us=%.0f allreduce_us=%.0f step_us=%.0f delayed=%d "
           "bad=%zu arrive_us=%.1f\n",
           rank, k, t1 - t0, t2 - t1, t2 - t0, delay > 0, bad, t1);
  }
  uint64_t csum = o.steps ? checksum64(recv, o.bytes) : 0;
  stats_print_summary(&st, "mpi_steps", rank, nranks, o.bytes, csum, errors);
  MPI_Finalize();
  return errors ? 3 : 0;
}
