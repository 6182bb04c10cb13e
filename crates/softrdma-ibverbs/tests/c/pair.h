/* Two connected RC QPs on two devices of one process, for the C tests of softrdma's own
 * calls (sdv.h), device memory and dma-buf regions, and the CHECK macro, clock and bounded
 * completion poll the other C tests share. Every wait is bounded. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

static int failures;
#define CHECK(cond, ...) do { if (!(cond)) { failures++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)

#define ALL_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char *buf;
	size_t len;
	union ibv_gid gid;
};

static inline double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* Poll one completion, for at most 10 s; 0 if none came. */
static inline int poll1(struct ibv_cq *cq, struct ibv_wc *wc)
{
	double end = now() + 10;
	while (now() < end) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n != 0)
			return n;
	}
	return 0;
}

static inline int setup(struct side *s, struct ibv_device *dev, size_t len)
{
	memset(s, 0, sizeof(*s));
	s->ctx = ibv_open_device(dev);
	s->pd = s->ctx ? ibv_alloc_pd(s->ctx) : NULL;
	s->cq = s->ctx ? ibv_create_cq(s->ctx, 64, NULL, NULL, 0) : NULL;
	s->len = len;
	s->buf = calloc(1, len);
	s->mr = s->pd ? ibv_reg_mr(s->pd, s->buf, len, ALL_ACCESS) : NULL;
	struct ibv_qp_init_attr a = { .send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
				      .cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 } };
	s->qp = s->pd ? ibv_create_qp(s->pd, &a) : NULL;
	if (!s->ctx || !s->pd || !s->cq || !s->mr || !s->qp || ibv_query_gid(s->ctx, 1, 0, &s->gid))
		return 1;
	return 0;
}

static inline int connect_qp(struct side *s, struct side *peer)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC };
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		return 1;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer->qp->qp_num;
	a.rq_psn = 7;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 1;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = peer->gid;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return 2;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 7;
	a.max_rd_atomic = 4;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		return 3;
	return 0;
}

/* Post one signaled RDMA READ or WRITE of `len` bytes between `local` (lkey) and
 * `remote` (rkey) on s's QP and wait for its completion: the status, or -1. */
static inline int rdma(struct side *s, enum ibv_wr_opcode op, void *local, uint32_t lkey, uint32_t len,
		uint64_t remote, uint32_t rkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)local, .length = len, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = 77, .sg_list = &sge, .num_sge = 1, .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
	wr.wr.rdma.remote_addr = remote;
	wr.wr.rdma.rkey = rkey;
	if (ibv_post_send(s->qp, &wr, &bad))
		return -1;
	struct ibv_wc wc;
	if (poll1(s->cq, &wc) != 1 || wc.wr_id != 77)
		return -1;
	return wc.status;
}

static inline void teardown(struct side *s)
{
	CHECK(ibv_destroy_qp(s->qp) == 0, "destroy_qp");
	CHECK(ibv_destroy_cq(s->cq) == 0, "destroy_cq");
	CHECK(ibv_dereg_mr(s->mr) == 0, "dereg");
	CHECK(ibv_dealloc_pd(s->pd) == 0, "dealloc pd");
	CHECK(ibv_close_device(s->ctx) == 0, "close");
	free(s->buf);
}
