/* Migrate a registered buffer under a peer's traffic, with softrdma's own calls (sdv.h).
 *
 * Two softrdma devices in one process: the owner registers a region on mmapped memory, the
 * peer streams 32 MiB messages into and out of it over an RC connection: an RDMA WRITE, a
 * SEND, an RDMA READ, then an atomic. In the middle of each, the owner suspends the region
 * (softrdma_mr_suspend returns once the placements in flight are done), copies it to a newly
 * mmapped buffer, resumes it there (softrdma_mr_resume: same IOVA, same keys) and unmaps the
 * old buffer. The peer notices nothing but RNR NAKs (for the READ, its response stream pauses
 * with one and the peer asks again from there): every completion is IBV_WC_SUCCESS and every
 * byte ends up in the new memory.
 *
 * Build and run (from the repository root, after `bash scripts/build-ibverbs`):
 *   cc -std=gnu11 -Itarget/softrdma-lib/include crates/softrdma-ibverbs/examples/c/migrate.c \
 *      -Ltarget/softrdma-lib -l:libibverbs.so.1 -o migrate
 *   LD_LIBRARY_PATH=target/softrdma-lib SOFTRDMA_PIN=on-demand \
 *      SOFTRDMA_DEVICES=softrdma0=127.0.0.1,softrdma1=127.0.0.2 ./migrate
 * It prints "ALL OK" and exits 0, or names what failed and exits 1. Every wait is bounded. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <infiniband/verbs.h>
#include <softrdma/sdv.h>

#define MSG (32u << 20)    /* bytes per message */
#define REGION (MSG + 4096) /* the message, then the atomic's 8 bytes */
#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)

static int failures;
#define CHECK(cond, ...) do { if (!(cond)) { failures++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	unsigned char *buf; /* the owner's: where the region's bytes are now */
	union ibv_gid gid;
};

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static unsigned char pattern(uint64_t i, unsigned seed)
{
	return (unsigned char)(i * 131 + (i >> 12) + seed * 17);
}

static void fill(unsigned char *p, size_t len, unsigned seed)
{
	for (size_t i = 0; i < len; i++)
		p[i] = pattern(i, seed);
}

static size_t first_mismatch(const unsigned char *p, size_t len, unsigned seed)
{
	for (size_t i = 0; i < len; i++)
		if (p[i] != pattern(i, seed))
			return i;
	return len;
}

/* Wait up to 5 s for the byte at `p` to become `want` (the engine threads write it). */
static int await_byte(const unsigned char *p, unsigned char want)
{
	double end = now() + 5;
	while (now() < end)
		if (*(volatile const unsigned char *)p == want)
			return 1;
	return 0;
}

/* One completion within 20 s. */
static int poll1(struct ibv_cq *cq, struct ibv_wc *wc)
{
	double end = now() + 20;
	while (now() < end) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n != 0)
			return n;
	}
	return 0;
}

static int setup(struct side *s, struct ibv_device *dev, unsigned char *buf, size_t len)
{
	s->ctx = ibv_open_device(dev);
	s->pd = s->ctx ? ibv_alloc_pd(s->ctx) : NULL;
	s->cq = s->ctx ? ibv_create_cq(s->ctx, 16, NULL, NULL, 0) : NULL;
	s->buf = buf;
	s->mr = s->pd ? ibv_reg_mr(s->pd, buf, len, ACCESS) : NULL;
	struct ibv_qp_init_attr a = { .send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
				      .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	s->qp = s->pd ? ibv_create_qp(s->pd, &a) : NULL;
	return !s->mr || !s->qp || ibv_query_gid(s->ctx, 1, 0, &s->gid);
}

static int connect_qp(struct side *s, struct side *peer)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = ACCESS };
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		return 1;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer->qp->qp_num;
	a.rq_psn = 1;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 1; /* the peer retries an RNR NAK after 10 us */
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = peer->gid;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return 2;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14; /* 67 ms (a suspension makes RNR NAKs, not timeouts) */
	a.retry_cnt = 7;
	a.rnr_retry = 7; /* retry RNR NAKs for ever: the owner decides how long it takes */
	a.sq_psn = 1;
	a.max_rd_atomic = 4;
	return ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) ? 3 : 0;
}

static uint32_t state_of(struct ibv_mr *mr)
{
	struct softrdma_mr_coherence c = { .size = sizeof(c) };
	return softrdma_mr_query_coherence(mr, &c) == 0 ? c.state : 99;
}

/* The owner's move, the region suspended: copy to new memory, resume there, unmap the old. */
static void move(struct side *o, const char *what)
{
	CHECK(state_of(o->mr) == SOFTRDMA_MR_SUSPENDED, "%s: not suspended", what);
	unsigned char *fresh = mmap(NULL, REGION, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(fresh != MAP_FAILED, "%s: mmap", what);
	if (fresh == MAP_FAILED)
		exit(1);
	memcpy(fresh, o->buf, REGION);
	int r = softrdma_mr_resume(o->mr, fresh);
	CHECK(r == 0 && o->mr->addr == fresh, "%s: resume at the new address: %d", what, r);
	CHECK(munmap(o->buf, REGION) == 0, "%s: munmap the old buffer", what);
	o->buf = fresh;
	CHECK(state_of(o->mr) == SOFTRDMA_MR_ACTIVE, "%s: active after resume", what);
}

/* Suspend the owner's region once `seen` shows the message is under way, and say whether it
 * was in its middle (the byte at `last` not placed yet). */
static void suspend_mid(struct side *o, const unsigned char *seen, unsigned char want,
			const unsigned char *last, unsigned char last_want, const char *what)
{
	CHECK(await_byte(seen, want), "%s: the message did not start", what);
	int r = softrdma_mr_suspend(o->mr);
	CHECK(r == 0, "%s: suspend: %d", what, r);
	int mid = *(volatile const unsigned char *)last != last_want;
	printf("%s: suspended %s\n", what, mid ? "mid-message" : "after the last byte");
	CHECK(mid, "%s: the message was complete before the suspension", what);
}

static void post(struct side *s, struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad = NULL;
	CHECK(ibv_post_send(s->qp, wr, &bad) == 0, "post_send opcode %d", wr->opcode);
}

static void expect_success(struct side *s, uint64_t wr_id, const char *what)
{
	struct ibv_wc wc = { .status = -1 };
	int n = poll1(s->cq, &wc);
	CHECK(n == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == wr_id, "%s: completion n=%d status=%d (%s) wr_id=%llu",
	      what, n, wc.status, n == 1 ? ibv_wc_status_str(wc.status) : "none", (unsigned long long)wc.wr_id);
}

int main(void)
{
	int n = -1;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 2) {
		printf("FAIL: two softrdma devices needed (SOFTRDMA_DEVICES=softrdma0=127.0.0.1,softrdma1=127.0.0.2)\n");
		return 1;
	}
	struct side o = { 0 }, p = { 0 };
	unsigned char *region = mmap(NULL, REGION, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	/* The peer's memory: a source, a READ destination, the atomic's result. */
	unsigned char *pbuf = mmap(NULL, 2 * (size_t)MSG + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (region == MAP_FAILED || pbuf == MAP_FAILED || setup(&o, list[0], region, REGION) ||
	    setup(&p, list[1], pbuf, 2 * (size_t)MSG + 4096) || connect_qp(&o, &p) || connect_qp(&p, &o)) {
		printf("FAIL: setup\n");
		return 1;
	}
	unsigned char *src = pbuf, *dst = pbuf + MSG;
	uint64_t *result = (uint64_t *)(pbuf + 2 * (size_t)MSG);
	/* What peers and SGEs name the region by, whatever memory it is on. */
	const uint64_t iova = (uintptr_t)region;
	const uint32_t rkey = o.mr->rkey, lkey = o.mr->lkey;
	struct ibv_sge psge = { .addr = (uintptr_t)src, .length = MSG, .lkey = p.mr->lkey };

	/* 1. RDMA WRITE of 32 MiB, the region moved in its middle. */
	fill(src, MSG, 1);
	struct ibv_send_wr w = { .wr_id = 1, .sg_list = &psge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				 .send_flags = IBV_SEND_SIGNALED };
	w.wr.rdma.remote_addr = iova;
	w.wr.rdma.rkey = rkey;
	post(&p, &w);
	suspend_mid(&o, o.buf, pattern(0, 1), o.buf + MSG - 1, pattern(MSG - 1, 1), "WRITE");
	move(&o, "WRITE");
	expect_success(&p, 1, "WRITE");
	CHECK(first_mismatch(o.buf, MSG, 1) == MSG, "WRITE: byte %zu differs in the new memory", first_mismatch(o.buf, MSG, 1));

	/* 2. SEND of 32 MiB into a receive on the region (posted by IOVA), moved in its middle. */
	struct ibv_sge osge = { .addr = iova, .length = MSG, .lkey = lkey };
	struct ibv_recv_wr rw = { .wr_id = 2, .sg_list = &osge, .num_sge = 1 }, *rbad = NULL;
	CHECK(ibv_post_recv(o.qp, &rw, &rbad) == 0, "post_recv");
	fill(src, MSG, 2);
	w.wr_id = 3;
	w.opcode = IBV_WR_SEND;
	post(&p, &w);
	suspend_mid(&o, o.buf, pattern(0, 2), o.buf + MSG - 1, pattern(MSG - 1, 2), "SEND");
	move(&o, "SEND");
	expect_success(&p, 3, "SEND");
	struct ibv_wc wc = { .status = -1 };
	CHECK(poll1(o.cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 2 && wc.opcode == IBV_WC_RECV &&
	      wc.byte_len == MSG, "SEND: receive status=%d byte_len=%u", wc.status, wc.byte_len);
	CHECK(first_mismatch(o.buf, MSG, 2) == MSG, "SEND: byte %zu differs in the new memory", first_mismatch(o.buf, MSG, 2));

	/* 3. RDMA READ of 32 MiB out of the region, moved while the responses stream. */
	fill(o.buf, MSG, 3);
	struct ibv_sge dsge = { .addr = (uintptr_t)dst, .length = MSG, .lkey = p.mr->lkey };
	w.wr_id = 4;
	w.opcode = IBV_WR_RDMA_READ;
	w.sg_list = &dsge;
	post(&p, &w);
	suspend_mid(&o, dst, pattern(0, 3), dst + MSG - 1, pattern(MSG - 1, 3), "READ");
	move(&o, "READ");
	expect_success(&p, 4, "READ");
	CHECK(first_mismatch(dst, MSG, 3) == MSG, "READ: byte %zu differs", first_mismatch(dst, MSG, 3));

	/* 4. A fetch-and-add on the region while it is suspended, moved before it is served. */
	uint64_t *counter = (uint64_t *)(o.buf + MSG);
	*counter = 1000;
	struct softrdma_qp_counters oq = { .size = sizeof(oq) };
	CHECK(softrdma_query_qp_counters(o.qp, &oq) == 0, "owner QP counters");
	uint64_t rnr_before = oq.rnr_naks_sent;
	CHECK(softrdma_mr_suspend(o.mr) == 0, "ATOMIC: suspend");
	struct ibv_sge asge = { .addr = (uintptr_t)result, .length = 8, .lkey = p.mr->lkey };
	struct ibv_send_wr aw = { .wr_id = 5, .sg_list = &asge, .num_sge = 1, .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
				  .send_flags = IBV_SEND_SIGNALED };
	aw.wr.atomic.remote_addr = iova + MSG;
	aw.wr.atomic.rkey = rkey;
	aw.wr.atomic.compare_add = 5;
	post(&p, &aw);
	double end = now() + 5;
	while (now() < end && softrdma_query_qp_counters(o.qp, &oq) == 0 && oq.rnr_naks_sent == rnr_before)
		;
	CHECK(oq.rnr_naks_sent > rnr_before, "ATOMIC: no RNR NAK while suspended");
	move(&o, "ATOMIC");
	expect_success(&p, 5, "ATOMIC");
	CHECK(*result == 1000 && *(uint64_t *)(o.buf + MSG) == 1005, "ATOMIC: fetched %llu, now %llu",
	      (unsigned long long)*result, (unsigned long long)*(uint64_t *)(o.buf + MSG));

	/* What each side counted, through sdv.h. */
	struct softrdma_qp_counters pq = { .size = sizeof(pq) };
	oq.size = sizeof(oq);
	CHECK(softrdma_query_qp_counters(p.qp, &pq) == 0 && softrdma_query_qp_counters(o.qp, &oq) == 0, "QP counters");
	printf("peer: %llu RNR NAKs received, %llu timeouts, %llu retransmits; owner: %llu RNR NAKs sent\n",
	       (unsigned long long)pq.rnr_naks_received, (unsigned long long)pq.timeouts,
	       (unsigned long long)pq.retransmits, (unsigned long long)oq.rnr_naks_sent);
	CHECK(pq.rnr_naks_received > 0 && oq.rnr_naks_sent > 0, "RNR NAKs were counted");
	struct softrdma_counters dc = { .size = sizeof(dc) };
	CHECK(softrdma_query_counters(o.ctx, &dc) == 0, "device counters");
	printf("owner device: %llu packets received, %llu sent, %llu access faults\n", (unsigned long long)dc.rx_packets,
	       (unsigned long long)dc.tx_packets, (unsigned long long)dc.access_faults);
	CHECK(dc.access_faults == 0, "no access faulted");
	struct softrdma_mr_coherence c = { .size = sizeof(c) };
	CHECK(softrdma_mr_query_coherence(o.mr, &c) == 0 && c.state == SOFTRDMA_MR_ACTIVE && c.iova == iova &&
	      c.addr == (uintptr_t)o.buf && o.mr->rkey == rkey && o.mr->lkey == lkey, "the region after four moves");

	ibv_destroy_qp(o.qp);
	ibv_destroy_qp(p.qp);
	CHECK(ibv_dereg_mr(o.mr) == 0 && ibv_dereg_mr(p.mr) == 0, "dereg");
	ibv_destroy_cq(o.cq);
	ibv_destroy_cq(p.cq);
	ibv_dealloc_pd(o.pd);
	ibv_dealloc_pd(p.pd);
	ibv_close_device(o.ctx);
	ibv_close_device(p.ctx);
	munmap(o.buf, REGION);
	munmap(pbuf, 2 * (size_t)MSG + 4096);
	ibv_free_device_list(list);
	if (failures)
		return 1;
	printf("ALL OK\n");
	return 0;
}
