/* Many RC QP pairs through verbs.h against softrdma's libibverbs.so.1: two devices in one
 * process, QP_SCALE_PAIRS pairs (default 8,000: 16,000 QPs) created and connected, then one
 * 64-byte RDMA WRITE posted on every pair at once. Every WRITE must complete successfully and
 * place its own bytes. Prints the connect cost per pair, the WRITE cost per operation and the
 * resident memory per QP. Every wait is bounded. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

#define LEN 64

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static long rss_bytes(void)
{
	long pages = 0, resident = 0;
	FILE *f = fopen("/proc/self/statm", "r");
	if (f) {
		if (fscanf(f, "%ld %ld", &pages, &resident) != 2)
			resident = 0;
		fclose(f);
	}
	return resident * 4096;
}

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	char *buf;
	union ibv_gid gid;
};

static int open_side(struct side *s, struct ibv_device *dev, int pairs)
{
	s->ctx = ibv_open_device(dev);
	if (!s->ctx)
		return 1;
	s->pd = ibv_alloc_pd(s->ctx);
	s->cq = ibv_create_cq(s->ctx, pairs + 16, NULL, NULL, 0);
	s->buf = calloc(pairs, LEN);
	if (!s->pd || !s->cq || !s->buf)
		return 2;
	s->mr = ibv_reg_mr(s->pd, s->buf, (size_t)pairs * LEN,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!s->mr || ibv_query_gid(s->ctx, 1, 0, &s->gid))
		return 3;
	return 0;
}

static struct ibv_qp *create(struct side *s)
{
	struct ibv_qp_init_attr a = { .send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
				      .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	return ibv_create_qp(s->pd, &a);
}

static int connect_qp(struct ibv_qp *qp, uint32_t dest, union ibv_gid *gid, uint32_t sq_psn, uint32_t rq_psn)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		return 1;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest;
	a.rq_psn = rq_psn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *gid;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return 2;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = sq_psn;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		return 3;
	return 0;
}

int main(void)
{
	const char *env = getenv("QP_SCALE_PAIRS");
	int pairs = env ? atoi(env) : 8000;
	if (pairs <= 0 || pairs > 100000) {
		printf("FAIL: QP_SCALE_PAIRS=%s\n", env);
		return 1;
	}
	int n = -1;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n != 2) {
		printf("FAIL: device list n=%d\n", n);
		return 1;
	}
	struct side a, b;
	int rc = open_side(&a, list[0], pairs);
	if (rc || (rc = open_side(&b, list[1], pairs))) {
		printf("FAIL: setup %d errno %d\n", rc, errno);
		return 1;
	}
	/* Pair i's bytes start with i + 1 and are filled with (i % 251) + 1. */
	for (int i = 0; i < pairs; i++) {
		char *c = a.buf + (size_t)i * LEN;
		uint64_t tag = (uint64_t)i + 1;
		memset(c, i % 251 + 1, LEN);
		memcpy(c, &tag, sizeof(tag));
	}
	struct ibv_qp **qa = calloc(pairs, sizeof(*qa)), **qb = calloc(pairs, sizeof(*qb));
	long rss0 = rss_bytes();
	double t0 = now();
	for (int i = 0; i < pairs; i++) {
		qa[i] = create(&a);
		qb[i] = create(&b);
		if (!qa[i] || !qb[i]) {
			printf("FAIL: create_qp %d: errno %d\n", i, errno);
			return 1;
		}
		uint32_t pa = (uint32_t)rand() & 0xffffff, pb = (uint32_t)rand() & 0xffffff;
		if ((rc = connect_qp(qa[i], qb[i]->qp_num, &b.gid, pa, pb)) ||
		    (rc = connect_qp(qb[i], qa[i]->qp_num, &a.gid, pb, pa))) {
			printf("FAIL: connect %d: step %d errno %d\n", i, rc, errno);
			return 1;
		}
	}
	double connect = now() - t0;

	double t1 = now();
	for (int i = 0; i < pairs; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)(a.buf + (size_t)i * LEN), .length = LEN, .lkey = a.mr->lkey };
		struct ibv_send_wr wr = { .wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
		wr.wr.rdma.remote_addr = (uintptr_t)(b.buf + (size_t)i * LEN);
		wr.wr.rdma.rkey = b.mr->rkey;
		if ((rc = ibv_post_send(qa[i], &wr, &bad))) {
			printf("FAIL: post_send %d: %d\n", i, rc);
			return 1;
		}
	}
	int done = 0, ok = 0;
	char *seen = calloc(pairs, 1);
	double end = t1 + 10 + pairs / 1000.0;
	struct ibv_wc wc[64];
	while (done < pairs && now() < end) {
		int k = ibv_poll_cq(a.cq, 64, wc);
		if (k < 0) {
			printf("FAIL: poll_cq %d\n", k);
			return 1;
		}
		for (int j = 0; j < k; j++) {
			done++;
			if (wc[j].wr_id >= (uint64_t)pairs || seen[wc[j].wr_id]++) {
				printf("FAIL: completion for wr_id %llu\n", (unsigned long long)wc[j].wr_id);
				return 1;
			}
			if (wc[j].status == IBV_WC_SUCCESS)
				ok++;
			else if (done - ok <= 3)
				printf("WRITE %llu: %s\n", (unsigned long long)wc[j].wr_id, ibv_wc_status_str(wc[j].status));
		}
	}
	double write = now() - t1;
	long rss1 = rss_bytes();
	int placed = 0;
	for (int i = 0; i < pairs; i++)
		placed += !memcmp(a.buf + (size_t)i * LEN, b.buf + (size_t)i * LEN, LEN);
	printf("pairs %d: connect %.1f us/pair, WRITE %.2f us/op, %.0f bytes/QP resident, %d completed, %d ok, %d placed\n",
	       pairs, connect * 1e6 / pairs, write * 1e6 / pairs, (double)(rss1 - rss0) / (2.0 * pairs), done, ok, placed);
	if (done != pairs || ok != pairs || placed != pairs) {
		printf("FAIL\n");
		return 1;
	}
	for (int i = 0; i < pairs; i++)
		if (ibv_destroy_qp(qa[i]) || ibv_destroy_qp(qb[i])) {
			printf("FAIL: destroy_qp %d\n", i);
			return 1;
		}
	if (ibv_dereg_mr(a.mr) || ibv_dereg_mr(b.mr) || ibv_destroy_cq(a.cq) || ibv_destroy_cq(b.cq) ||
	    ibv_dealloc_pd(a.pd) || ibv_dealloc_pd(b.pd) || ibv_close_device(a.ctx) || ibv_close_device(b.ctx)) {
		printf("FAIL: teardown\n");
		return 1;
	}
	ibv_free_device_list(list);
	free(qa);
	free(qb);
	free(seen);
	free(a.buf);
	free(b.buf);
	printf("ALL OK\n");
	return 0;
}
