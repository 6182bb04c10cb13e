/* "Tear all the connections using it down" through verbs.h: a registered buffer is unmapped
 * (CHANGE 0), moved by mremap (CHANGE 1) or discarded by madvise(MADV_DONTNEED) (CHANGE 2)
 * while a peer's 64 MiB RDMA WRITE streams into it, a peer's 256 MiB READ streams out of it
 * and a receive is posted into it. Every QP using it is in the error state with one
 * IBV_EVENT_QP_ACCESS_ERR on the async fd; the peer's WRITE and READ complete with
 * IBV_WC_REM_ACCESS_ERR, the receive with IBV_WC_WR_FLUSH_ERR; a bystander QP on the same
 * devices keeps working. Two devices in one process; every wait is bounded. */
#define _GNU_SOURCE
#include <poll.h>
#include <sys/mman.h>
#include <softrdma/sdv.h>
#include "pair.h"

#ifndef CHANGE
#define CHANGE 0
#endif

#define WLEN (64u << 20)
#define RLEN (256u << 20)

struct dev {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	union ibv_gid gid;
};

struct end {
	struct ibv_cq *cq;
	struct ibv_qp *qp;
};

static void open_dev(struct dev *d, struct ibv_device *dev)
{
	d->ctx = ibv_open_device(dev);
	d->pd = d->ctx ? ibv_alloc_pd(d->ctx) : NULL;
	CHECK(d->pd && ibv_query_gid(d->ctx, 1, 0, &d->gid) == 0, "open");
}

static void make_end(struct end *e, struct dev *d)
{
	e->cq = ibv_create_cq(d->ctx, 16, NULL, NULL, 0);
	struct ibv_qp_init_attr a = { .send_cq = e->cq, .recv_cq = e->cq, .qp_type = IBV_QPT_RC,
				      .cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 } };
	e->qp = e->cq ? ibv_create_qp(d->pd, &a) : NULL;
	CHECK(e->qp, "create qp");
}

static int to_rts(struct end *e, struct end *peer, union ibv_gid *peer_gid)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };
	if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		return 1;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_4096;
	a.dest_qp_num = peer->qp->qp_num;
	a.rq_psn = 9;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 1;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *peer_gid;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return 2;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 9;
	a.max_rd_atomic = 4;
	return ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) ? 3 : 0;
}

static void connect_pair(struct end *v, struct dev *vd, struct end *p, struct dev *pd)
{
	make_end(v, vd);
	make_end(p, pd);
	if (failures)
		return;
	CHECK(to_rts(v, p, &pd->gid) == 0 && to_rts(p, v, &vd->gid) == 0, "connect");
}

static enum ibv_qp_state state(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	if (ibv_query_qp(qp, &a, IBV_QP_STATE, &ia))
		return (enum ibv_qp_state)-1;
	return a.qp_state;
}

static int post_rdma(struct ibv_qp *qp, uint64_t id, enum ibv_wr_opcode op, struct ibv_mr *local, uint32_t len,
		     uint64_t remote, uint32_t rkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)local->addr, .length = len, .lkey = local->lkey };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1, .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
	wr.wr.rdma.remote_addr = remote;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(qp, &wr, &bad);
}

int main(void)
{
	int n = -1;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n == 2, "device list n=%d", n);
	if (!list || n != 2)
		return 1;
	struct dev v, p;
	open_dev(&v, list[0]);
	open_dev(&p, list[1]);
	struct end wv, wp, rv, rp, qv, qp, bv, bp; /* WRITE, READ, receive, bystander */
	connect_pair(&wv, &v, &wp, &p);
	connect_pair(&rv, &v, &rp, &p);
	connect_pair(&qv, &v, &qp, &p);
	connect_pair(&bv, &v, &bp, &p);
	if (failures)
		return 1;

	/* The victim's buffer: the WRITE lands in its first part, the READ reads the rest. */
	size_t len = (size_t)WLEN + RLEN;
	unsigned char *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(base != MAP_FAILED, "mmap");
	if (base == MAP_FAILED)
		return 1;
	memset(base, 0, WLEN);
	memset(base + WLEN, 0x5a, RLEN);
	struct ibv_mr *r = ibv_reg_mr(v.pd, base, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	char *other = calloc(1, 4096);
	struct ibv_mr *o = ibv_reg_mr(v.pd, other, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	unsigned char *wsrc = malloc(WLEN), *rdst = calloc(1, RLEN), *ping = calloc(1, 64);
	CHECK(r && o && wsrc && rdst && ping, "buffers");
	if (failures)
		return 1;
	memset(wsrc, 0xc3, WLEN);
	struct ibv_mr *wm = ibv_reg_mr(p.pd, wsrc, WLEN, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *rm = ibv_reg_mr(p.pd, rdst, RLEN, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *pm = ibv_reg_mr(p.pd, ping, 64, IBV_ACCESS_LOCAL_WRITE);
	CHECK(wm && rm && pm, "peer buffers");
	if (failures)
		return 1;

	struct ibv_wc wc;
	CHECK(post_rdma(bp.qp, 1, IBV_WR_RDMA_WRITE, pm, 64, (uintptr_t)other, o->rkey) == 0 &&
	      poll1(bp.cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS, "bystander before");

	/* A receive posted into the buffer. */
	struct ibv_sge rs = { .addr = (uintptr_t)base, .length = 4096, .lkey = r->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 30, .sg_list = &rs, .num_sge = 1 }, *rbad = NULL;
	CHECK(ibv_post_recv(qv.qp, &rwr, &rbad) == 0, "post_recv");
	/* The peer's READ and WRITE. */
	CHECK(post_rdma(rp.qp, 20, IBV_WR_RDMA_READ, rm, RLEN, (uintptr_t)base + WLEN, r->rkey) == 0, "post READ");
	CHECK(post_rdma(wp.qp, 21, IBV_WR_RDMA_WRITE, wm, WLEN - 8192, (uintptr_t)base + 8192, r->rkey) == 0,
	      "post WRITE");
	/* Unmap once both are under way. */
	double end = now() + 10;
	while (now() < end && !(((volatile unsigned char *)base)[8192] && ((volatile unsigned char *)rdst)[0]))
		;
	CHECK(base[8192] && rdst[0], "the WRITE and the READ did not start within 10 s");
	if (CHANGE == 0) {
		CHECK(munmap(base, len) == 0, "munmap");
	} else if (CHANGE == 1) {
		void *to = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		CHECK(to != MAP_FAILED && mremap(base, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, to) == to, "mremap");
	} else {
		CHECK(madvise(base, len, MADV_DONTNEED) == 0, "madvise");
	}

	/* One IBV_EVENT_QP_ACCESS_ERR per QP that used the buffer. */
	struct ibv_qp *want[3] = { wv.qp, rv.qp, qv.qp };
	int seen[3] = { 0, 0, 0 }, got = 0;
	end = now() + 5;
	while (got < 3 && now() < end) {
		struct pollfd pf = { .fd = v.ctx->async_fd, .events = POLLIN };
		if (poll(&pf, 1, 100) != 1)
			continue;
		struct ibv_async_event ev;
		if (ibv_get_async_event(v.ctx, &ev))
			continue;
		CHECK(ev.event_type == IBV_EVENT_QP_ACCESS_ERR, "event %s", ibv_event_type_str(ev.event_type));
		for (int i = 0; i < 3; i++)
			if (ev.event_type == IBV_EVENT_QP_ACCESS_ERR && ev.element.qp == want[i] && !seen[i]) {
				seen[i] = 1;
				got++;
			}
		ibv_ack_async_event(&ev);
	}
	CHECK(seen[0] && seen[1] && seen[2], "QP access errors: WRITE %d READ %d receive %d", seen[0], seen[1], seen[2]);
	CHECK(state(wv.qp) == IBV_QPS_ERR && state(rv.qp) == IBV_QPS_ERR && state(qv.qp) == IBV_QPS_ERR,
	      "the QPs using the buffer are in error: %d %d %d", state(wv.qp), state(rv.qp), state(qv.qp));

	CHECK(poll1(wp.cq, &wc) == 1 && wc.wr_id == 21 && wc.status == IBV_WC_REM_ACCESS_ERR,
	      "peer WRITE: %s", ibv_wc_status_str(wc.status));
	CHECK(poll1(rp.cq, &wc) == 1 && wc.wr_id == 20 && wc.status == IBV_WC_REM_ACCESS_ERR,
	      "peer READ: %s", ibv_wc_status_str(wc.status));
	CHECK(poll1(qv.cq, &wc) == 1 && wc.wr_id == 30 && wc.status == IBV_WC_WR_FLUSH_ERR,
	      "receive: %s", ibv_wc_status_str(wc.status));

	/* Discarded pages read as zero: nothing was placed after madvise returned. */
	if (CHANGE == 2) {
		size_t placed = 0;
		for (size_t i = 0; i < len; i++)
			placed += base[i] != 0;
		CHECK(placed == 0, "%zu bytes placed after MADV_DONTNEED returned", placed);
	}

	/* The bystander is untouched. */
	CHECK(state(bv.qp) == IBV_QPS_RTS, "bystander state %d", state(bv.qp));
	for (int i = 0; i < 10; i++)
		CHECK(post_rdma(bp.qp, 100 + i, IBV_WR_RDMA_WRITE, pm, 64, (uintptr_t)other, o->rkey) == 0 &&
		      poll1(bp.cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS, "bystander after %d", i);
	struct pollfd pf = { .fd = v.ctx->async_fd, .events = POLLIN };
	CHECK(poll(&pf, 1, 0) == 0, "no further event");
	/* The device counts them (softrdma/sdv.h). */
	struct softrdma_counters c = { .size = sizeof(c) };
	CHECK(softrdma_query_counters(v.ctx, &c) == 0 && c.size == sizeof(c) && c.access_violations == 3,
	      "access_violations %llu (size %u)", (unsigned long long)c.access_violations, c.size);

	if (failures)
		return 1;
	printf("ALL OK\n");
	return 0;
}
