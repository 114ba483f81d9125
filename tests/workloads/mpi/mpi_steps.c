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
 * --desync-rank R --desync-step K [--desync-mode op|count|skip]: every step adds a second
 * collective, a 64-byte MPI_Bcast from rank 0 (a small parameter broadcast); at step K rank
 * R's first call disagrees with the others': op: MPI_Bcast (root 0, the same count) in place
 * of the MPI_Allreduce; count: MPI_Allreduce of half the count; skip: no MPI_Allreduce (its
 * MPI_Bcast then meets the others' MPI_Allreduce). The job hangs or a call fails; a rank
 * whose call fails waits, and every rank ends itself after 40 s (alarm).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stepcommon.h"

static const char usage[] =
    "usage: mpirun ... mpi_steps [--steps S] [--bytes B] [--compute-us C]\n"
    "                  [--marker-socket PATH] [--delay-rank R --delay-us D [--delay-every K]]\n"
    "                  [--no-verify] [--stop-rank R --stop-step K] [--vary-us V]\n"
    "                  [--start-at-us T --period-us P]\n"
    "                  [--desync-rank R --desync-step K [--desync-mode op|count|skip]]\n"
    "  Steps of C us busy-wait + one MPI_Allreduce of B bytes (float sum).\n";

static const char* const desync_names[] = {"", "op", "count", "skip"};

/* The step's collectives: the MPI_Allreduce and, with --desync-rank, the 64-byte MPI_Bcast;
 * the desync rank's call at the desync step disagrees (see the top). */
static int step_collectives(const struct step_opts* o, int rank, long k, float* send, float* recv, size_t count,
                            float* small) {
  int odd = rank == o->desync_rank && k == o->desync_step;
  int rc = MPI_SUCCESS;
  if (odd) {
    printf("desync rank=%d step=%ld mode=%s pid=%d\n", rank, k, desync_names[o->desync_mode], (int)getpid());
    fflush(stdout);
  }
  if (odd && o->desync_mode == DESYNC_OP)
    rc = MPI_Bcast(recv, (int)count, MPI_FLOAT, 0, MPI_COMM_WORLD);
  else if (odd && o->desync_mode == DESYNC_COUNT)
    rc = MPI_Allreduce(send, recv, (int)(count / 2), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  else if (!(odd && o->desync_mode == DESYNC_SKIP))
    rc = MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  if (rc == MPI_SUCCESS && o->desync_rank >= 0) rc = MPI_Bcast(small, 16, MPI_FLOAT, 0, MPI_COMM_WORLD);
  return rc;
}

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
  float small[16];
  memset(small, 0, sizeof small);
  if (o.desync_rank >= 0) alarm(40);

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
    int rc = step_collectives(&o, rank, k, send, recv, count, small);
    double t2 = now_us();
    marker_send(&m, rank, k, "end");
    if (rc != MPI_SUCCESS) {
      char msg[MPI_MAX_ERROR_STRING];
      int len = 0;
      MPI_Error_string(rc, msg, &len);
      fprintf(stderr, "mpi_steps rank %d step %ld: a collective failed: %s\n", rank, k, msg);
      printf("failed rank=%d step=%ld\n", rank, k);
      fflush(stdout);
      if (o.desync_rank >= 0)
        for (;;) pause(); /* the others stay inside; the alarm ends it */
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
