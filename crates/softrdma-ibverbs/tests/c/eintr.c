/* A signal handler installed without SA_RESTART interrupts a thread blocked in
 * ibv_get_cq_event (and in rdma_get_cm_event's kind of wait): the call returns -1 with errno
 * EINTR, as libibverbs' read() of its channel does. Benchmarks end their loops this way
 * (qperf's SIGALRM). The library's own threads must not take the signal instead. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

static volatile sig_atomic_t fired;
static void on_alarm(int sig) { (void)sig; fired = 1; }

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx = list ? ibv_open_device(list[0]) : NULL;
	struct ibv_comp_channel *ch = ctx ? ibv_create_comp_channel(ctx) : NULL;
	struct ibv_cq *cq = ch ? ibv_create_cq(ctx, 4, NULL, ch, 0) : NULL;
	if (!cq || ibv_req_notify_cq(cq, 0)) {
		printf("FAIL setup\n");
		return 1;
	}
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_alarm; /* no SA_RESTART */
	sigaction(SIGALRM, &sa, NULL);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	alarm(1);
	struct ibv_cq *ecq;
	void *ectx;
	errno = 0;
	int rc = ibv_get_cq_event(ch, &ecq, &ectx);
	int e = errno;
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double s = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
	if (rc != -1 || e != EINTR || !fired || s > 5) {
		printf("FAIL rc=%d errno=%d fired=%d after %.2f s\n", rc, e, (int)fired, s);
		return 1;
	}
	ibv_destroy_cq(cq);
	ibv_destroy_comp_channel(ch);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("interrupted after %.2f s\nALL OK\n", s);
	return 0;
}
