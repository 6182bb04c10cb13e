/* The data path through verbs.h against softrdma's libibverbs.so.1, two devices in one
 * process (acceptance 5): posting in RESET, destroying a CQ in use, a bad lkey, NULLs, and
 * every opcode's completion as libibverbs defines it. Every wait is bounded. */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

static int failures;
#define CHECK(cond, ...) do { if (!(cond)) { failures++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char *buf;
	union ibv_gid gid;
};

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* Poll one completion, for at most 5 s. */
static int poll1(struct ibv_cq *cq, struct ibv_wc *wc)
{
	double end = now() + 5;
	while (now() < end) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n != 0)
			return n;
	}
	return 0;
}

static void setup(struct side *s, struct ibv_device *dev)
{
	s->ctx = ibv_open_device(dev);
	s->pd = ibv_alloc_pd(s->ctx);
	s->ch = ibv_create_comp_channel(s->ctx);
	s->cq = ibv_create_cq(s->ctx, 64, s, s->ch, 0);
	s->buf = calloc(1, 8192);
	s->mr = ibv_reg_mr(s->pd, s->buf, 8192, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			   IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
	struct ibv_qp_init_attr a = { .send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
				      .cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 2, .max_recv_sge = 2, .max_inline_data = 64 } };
	s->qp = ibv_create_qp(s->pd, &a);
	CHECK(s->ctx && s->pd && s->ch && s->cq && s->mr && s->qp, "setup");
	CHECK(a.cap.max_inline_data >= 64, "granted inline %u", a.cap.max_inline_data);
	CHECK(ibv_query_gid(s->ctx, 1, 0, &s->gid) == 0, "gid");
}

static int connect_qp(struct side *s, struct side *peer)
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
	a.min_rnr_timer = 12;
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

int main(void)
{
	int n = -1;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n == 2, "device list n=%d", n);
	if (!list || n != 2)
		return 1;
	struct side a, b;
	setup(&a, list[0]);
	setup(&b, list[1]);
	if (failures)
		return 1;

	struct ibv_sge sge = { .addr = (uintptr_t)a.buf, .length = 16, .lkey = a.mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
	struct ibv_recv_wr rwr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1 }, *rbad = NULL;

	/* RESET: posting sends is refused with EINVAL and bad_wr names the request (as rxe). */
	CHECK(ibv_post_send(a.qp, &wr, &bad) == EINVAL && bad == &wr, "post_send in RESET");
	rbad = NULL;
	CHECK(ibv_post_recv(a.qp, &rwr, &rbad) == EINVAL && rbad == &rwr, "post_recv in RESET");
	/* A CQ a QP uses cannot be destroyed; a channel with CQs neither. */
	CHECK(ibv_destroy_cq(a.cq) == EBUSY, "destroy_cq in use");
	CHECK(ibv_destroy_comp_channel(a.ch) == EBUSY, "destroy busy channel");
	CHECK(ibv_dealloc_pd(a.pd) == EBUSY, "dealloc pd in use");
	/* UC and UD QPs exist (their type reported back); raw packet QPs do not; bad attributes. */
	for (int t = IBV_QPT_UC; t <= IBV_QPT_UD; t++) {
		struct ibv_qp_init_attr un = { .send_cq = a.cq, .recv_cq = a.cq, .qp_type = t, .cap = { 1, 1, 1, 1, 0 } };
		struct ibv_qp *q = ibv_create_qp(a.pd, &un);
		CHECK(q != NULL && q->qp_type == t, "create qp type %d errno=%d", t, errno);
		if (q) {
			struct ibv_qp_attr qat;
			struct ibv_qp_init_attr qit;
			CHECK(ibv_query_qp(q, &qat, 0, &qit) == 0 && qit.qp_type == t, "query qp type %d", t);
			CHECK(ibv_destroy_qp(q) == 0, "destroy qp type %d", t);
		}
	}
	struct ibv_qp_init_attr raw = { .send_cq = a.cq, .recv_cq = a.cq, .qp_type = IBV_QPT_RAW_PACKET, .cap = { 1, 1, 1, 1, 0 } };
	errno = 0;
	CHECK(ibv_create_qp(a.pd, &raw) == NULL && errno == EOPNOTSUPP, "raw packet qp errno=%d", errno);
	struct ibv_qp_init_attr big = { .send_cq = a.cq, .recv_cq = a.cq, .qp_type = IBV_QPT_RC, .cap = { 1, 1, 64, 1, 0 } };
	errno = 0;
	CHECK(ibv_create_qp(a.pd, &big) == NULL && errno == EINVAL, "too many sges errno=%d", errno);
	struct ibv_qp_attr qa = { .qp_state = IBV_QPS_RTS };
	CHECK(ibv_modify_qp(a.qp, &qa, IBV_QP_STATE) == EINVAL, "RESET->RTS");
	CHECK(ibv_modify_qp(a.qp, NULL, IBV_QP_STATE) == EINVAL, "modify NULL attr");
	struct ibv_wc wc;
	CHECK(ibv_poll_cq(a.cq, -1, &wc) < 0, "poll_cq negative count");
	CHECK(ibv_poll_cq(a.cq, 1, &wc) == 0, "empty cq");

	CHECK(connect_qp(&a, &b) == 0 && connect_qp(&b, &a) == 0, "connect");
	struct ibv_qp_init_attr qia;
	CHECK(ibv_query_qp(a.qp, &qa, IBV_QP_STATE | IBV_QP_CAP, &qia) == 0 && qa.qp_state == IBV_QPS_RTS &&
	      qia.cap.max_inline_data >= 64 && qa.dest_qp_num == b.qp->qp_num && qia.qp_type == IBV_QPT_RC, "query_qp");
	CHECK(a.qp->state == IBV_QPS_RTS, "qp->state");

	/* SEND with immediate: imm_data arrives in network byte order, IBV_WC_WITH_IMM set. */
	struct ibv_sge bsge = { .addr = (uintptr_t)b.buf, .length = 4096, .lkey = b.mr->lkey };
	struct ibv_recv_wr brwr = { .wr_id = 20, .sg_list = &bsge, .num_sge = 1 };
	CHECK(ibv_post_recv(b.qp, &brwr, &rbad) == 0, "post_recv");
	strcpy(a.buf, "hello softrdma!");
	wr.opcode = IBV_WR_SEND_WITH_IMM;
	wr.imm_data = htonl(0x12345678);
	CHECK(ibv_req_notify_cq(b.cq, 0) == 0, "req_notify");
	CHECK(ibv_post_send(a.qp, &wr, &bad) == 0, "post send_with_imm");
	/* Event mode: the channel's fd becomes readable, get_cq_event names the CQ. */
	struct pollfd pfd = { .fd = b.ch->fd, .events = POLLIN };
	CHECK(poll(&pfd, 1, 5000) == 1, "channel fd readable");
	struct ibv_cq *evcq = NULL; void *evctx = NULL;
	CHECK(ibv_get_cq_event(b.ch, &evcq, &evctx) == 0 && evcq == b.cq && evctx == &b, "get_cq_event");
	ibv_ack_cq_events(b.cq, 1);
	CHECK(poll1(b.cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.wr_id == 20 &&
	      wc.byte_len == 16 && (wc.wc_flags & IBV_WC_WITH_IMM) && wc.imm_data == htonl(0x12345678) &&
	      wc.qp_num == b.qp->qp_num && wc.src_qp == a.qp->qp_num, "recv wc status=%d opcode=%d imm=%x", wc.status, wc.opcode, wc.imm_data);
	CHECK(strcmp(b.buf, "hello softrdma!") == 0, "payload");
	CHECK(poll1(a.cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND && wc.wr_id == 1, "send wc");

	/* RDMA WRITE (inline) then READ back, atomics. */
	struct ibv_send_wr w2 = { .wr_id = 3, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE };
	w2.wr.rdma.remote_addr = (uintptr_t)b.buf + 1024;
	w2.wr.rdma.rkey = b.mr->rkey;
	strcpy(a.buf, "written inline.");
	CHECK(ibv_post_send(a.qp, &w2, &bad) == 0, "post write");
	CHECK(poll1(a.cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_WRITE, "write wc %d", wc.status);
	CHECK(strcmp(b.buf + 1024, "written inline.") == 0, "write landed");
	struct ibv_sge rsge = { .addr = (uintptr_t)a.buf + 2048, .length = 16, .lkey = a.mr->lkey };
	w2.sg_list = &rsge;
	w2.opcode = IBV_WR_RDMA_READ;
	w2.send_flags = IBV_SEND_SIGNALED;
	CHECK(ibv_post_send(a.qp, &w2, &bad) == 0, "post read");
	CHECK(poll1(a.cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_READ && wc.byte_len == 16, "read wc");
	CHECK(strcmp(a.buf + 2048, "written inline.") == 0, "read back");
	uint64_t *target = (uint64_t *)(b.buf + 4096), *orig = (uint64_t *)(a.buf + 4096);
	*target = 40;
	struct ibv_sge asge = { .addr = (uintptr_t)orig, .length = 8, .lkey = a.mr->lkey };
	struct ibv_send_wr w3 = { .wr_id = 4, .sg_list = &asge, .num_sge = 1, .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
				  .send_flags = IBV_SEND_SIGNALED };
	w3.wr.atomic.remote_addr = (uintptr_t)target;
	w3.wr.atomic.rkey = b.mr->rkey;
	w3.wr.atomic.compare_add = 2;
	CHECK(ibv_post_send(a.qp, &w3, &bad) == 0, "post faa");
	CHECK(poll1(a.cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_FETCH_ADD && *orig == 40 && *target == 42, "faa");
	w3.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
	w3.wr.atomic.compare_add = 42;
	w3.wr.atomic.swap = 7;
	CHECK(ibv_post_send(a.qp, &w3, &bad) == 0, "post cas");
	CHECK(poll1(a.cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_COMP_SWAP && *orig == 42 && *target == 7, "cas");

	/* An SRQ limit: armed at 3 with 4 receives posted, the second SEND into the SRQ leaves 2
	 * and reports IBV_EVENT_SRQ_LIMIT_REACHED once on the async fd; the limit then reads 0. */
	struct ibv_srq_init_attr lsia = { .attr = { .max_wr = 8, .max_sge = 1 } };
	struct ibv_srq *lsrq = ibv_create_srq(b.pd, &lsia);
	CHECK(lsrq != NULL, "create limit srq");
	struct side a2 = a, b2 = b;
	struct ibv_qp_init_attr qa2 = { .send_cq = a.cq, .recv_cq = a.cq, .qp_type = IBV_QPT_RC,
					.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 2, .max_recv_sge = 2 } };
	a2.qp = ibv_create_qp(a.pd, &qa2);
	struct ibv_qp_init_attr qb2 = { .send_cq = b.cq, .recv_cq = b.cq, .srq = lsrq, .qp_type = IBV_QPT_RC,
					.cap = { .max_send_wr = 16, .max_send_sge = 2 } };
	b2.qp = ibv_create_qp(b.pd, &qb2);
	CHECK(a2.qp && b2.qp && connect_qp(&a2, &b2) == 0 && connect_qp(&b2, &a2) == 0, "srq qp pair");
	for (int i = 0; lsrq && i < 4; i++) {
		struct ibv_sge s4 = { .addr = (uintptr_t)b.buf + 4096 + 64 * i, .length = 64, .lkey = b.mr->lkey };
		struct ibv_recv_wr r4 = { .wr_id = 40 + i, .sg_list = &s4, .num_sge = 1 };
		CHECK(ibv_post_srq_recv(lsrq, &r4, &rbad) == 0, "post_srq_recv %d", i);
	}
	struct ibv_srq_attr la = { .srq_limit = 9 };
	CHECK(lsrq && ibv_modify_srq(lsrq, &la, IBV_SRQ_LIMIT) == EINVAL, "limit above max_wr");
	la.srq_limit = 3;
	CHECK(lsrq && ibv_modify_srq(lsrq, &la, IBV_SRQ_LIMIT) == 0, "arm limit");
	CHECK(lsrq && ibv_query_srq(lsrq, &la) == 0 && la.srq_limit == 3 && la.max_wr == 8, "query armed limit %u", la.srq_limit);
	pfd.fd = b.ctx->async_fd;
	for (int i = 0; a2.qp && b2.qp && i < 2; i++) {
		if (i == 1)
			CHECK(poll(&pfd, 1, 0) == 0, "no event at 3 receives left");
		struct ibv_send_wr s5 = { .wr_id = 50 + i, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
					  .send_flags = IBV_SEND_SIGNALED }, *bad5 = NULL;
		CHECK(ibv_post_send(a2.qp, &s5, &bad5) == 0, "post send into srq");
		CHECK(poll1(a.cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 50 + i, "srq send wc %d", wc.status);
		CHECK(poll1(b.cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 40 + i && wc.qp_num == b2.qp->qp_num,
		      "srq recv wc %d", wc.status);
	}
	struct ibv_async_event lev;
	CHECK(poll(&pfd, 1, 5000) == 1 && ibv_get_async_event(b.ctx, &lev) == 0 &&
	      lev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED && lev.element.srq == lsrq, "SRQ_LIMIT_REACHED event");
	ibv_ack_async_event(&lev);
	CHECK(poll(&pfd, 1, 0) == 0, "the limit event comes once");
	CHECK(lsrq && ibv_query_srq(lsrq, &la) == 0 && la.srq_limit == 0, "limit disarmed %u", la.srq_limit);
	CHECK(ibv_destroy_srq(lsrq) == EBUSY, "destroy srq in use");
	CHECK(ibv_destroy_qp(b2.qp) == 0 && ibv_destroy_qp(a2.qp) == 0, "destroy srq qp pair");
	CHECK(ibv_destroy_srq(lsrq) == 0, "destroy limit srq");

	/* A bad lkey: the post succeeds, the request completes with IBV_WC_LOC_PROT_ERR (as rxe),
	 * the QP goes to the error state and IBV_EVENT_QP_FATAL is reported. */
	struct ibv_sge badsge = { .addr = (uintptr_t)a.buf, .length = 16, .lkey = a.mr->lkey ^ 0x5a5a00 };
	wr.sg_list = &badsge;
	wr.opcode = IBV_WR_SEND;
	wr.wr_id = 99;
	bad = NULL;
	CHECK(ibv_post_send(a.qp, &wr, &bad) == 0, "post with bad lkey");
	CHECK(poll1(a.cq, &wc) == 1 && wc.wr_id == 99 && wc.status == IBV_WC_LOC_PROT_ERR, "bad lkey wc status=%d", wc.status);
	pfd.fd = a.ctx->async_fd;
	struct ibv_async_event ev;
	CHECK(poll(&pfd, 1, 5000) == 1 && ibv_get_async_event(a.ctx, &ev) == 0 && ev.event_type == IBV_EVENT_QP_FATAL &&
	      ev.element.qp == a.qp, "QP_FATAL event");
	ibv_ack_async_event(&ev);
	/* Posting to the errored QP: flushed. */
	wr.sg_list = &sge;
	wr.wr_id = 100;
	if (ibv_post_send(a.qp, &wr, &bad) == 0)
		CHECK(poll1(a.cq, &wc) == 1 && wc.wr_id == 100 && wc.status == IBV_WC_WR_FLUSH_ERR, "flush status=%d", wc.status);

	/* NULL and foreign pointers on the control path. */
	CHECK(ibv_destroy_qp(NULL) == EINVAL, "destroy_qp NULL");
	CHECK(ibv_destroy_cq((struct ibv_cq *)a.buf) == EINVAL, "destroy_cq foreign");
	CHECK(ibv_query_qp(a.qp, NULL, 0, &qia) == EINVAL, "query_qp NULL");
	errno = 0;
	CHECK(ibv_create_srq(NULL, NULL) == NULL && errno == EINVAL, "create_srq NULL");
	errno = 0;
	CHECK(ibv_create_ah(a.pd, NULL) == NULL && errno == EINVAL, "create_ah NULL");
	struct ibv_srq_init_attr sia = { .attr = { .max_wr = 8, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(a.pd, &sia);
	CHECK(srq != NULL, "create_srq");
	struct ibv_srq_attr sa;
	CHECK(srq && ibv_query_srq(srq, &sa) == 0 && sa.max_wr == 8, "query_srq");
	CHECK(srq && ibv_post_srq_recv(srq, &rwr, &rbad) == 0, "post_srq_recv");
	CHECK(srq && ibv_destroy_srq(srq) == 0, "destroy_srq");
	struct ibv_ah_attr aha = { .is_global = 1, .port_num = 1 };
	aha.grh.dgid = b.gid;
	struct ibv_ah *ah = ibv_create_ah(a.pd, &aha);
	CHECK(ah && ibv_destroy_ah(ah) == 0, "ah");
	struct ibv_mw *mw = ibv_alloc_mw(a.pd, IBV_MW_TYPE_2);
	CHECK(mw != NULL && ibv_dealloc_mw(mw) == 0, "mw");

	/* Teardown in order; a CQ is free once its QP is gone. */
	for (int i = 0; i < 2; i++) {
		struct side *s = i ? &b : &a;
		CHECK(ibv_destroy_qp(s->qp) == 0, "destroy_qp");
		CHECK(ibv_destroy_qp(s->qp) == EINVAL, "destroy_qp twice");
		CHECK(ibv_destroy_cq(s->cq) == 0, "destroy_cq");
		CHECK(ibv_destroy_comp_channel(s->ch) == 0, "destroy channel");
		CHECK(ibv_dereg_mr(s->mr) == 0, "dereg");
		CHECK(ibv_dealloc_pd(s->pd) == 0, "dealloc pd");
		CHECK(ibv_close_device(s->ctx) == 0, "close");
		free(s->buf);
	}
	ibv_free_device_list(list);
	if (failures)
		return 1;
	printf("ALL OK\n");
	return 0;
}
