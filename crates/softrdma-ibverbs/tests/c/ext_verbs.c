/* The extended verbs through verbs.h: ODP capabilities and ibv_advise_mr, parent domains,
 * ibv_create_cq_ex with ibv_start_poll/next_poll/
 * end_poll and the ibv_wc_read_* calls, ibv_create_qp_ex with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS
 * and the ibv_wr_* post API (SEND with immediate from an SGE list, inline SEND, WRITE, READ,
 * both atomics, a type 2 window bound with ibv_wr_bind_mw, LOCAL_INV, a batch aborted, a
 * batch poisoned by a misused builder), type 1 windows bound with ibv_bind_mw completing as
 * work requests, and the errors of what the device does not offer. */
#include <arpa/inet.h>
#include "pair.h"

/* A QP made with ibv_create_qp_ex on `s`'s PD and extended CQ. */
static struct ibv_qp *qp_ex(struct side *s, struct ibv_cq_ex *cq, uint64_t ops)
{
	struct ibv_qp_init_attr_ex a = {
		.send_cq = ibv_cq_ex_to_cq(cq), .recv_cq = ibv_cq_ex_to_cq(cq), .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 2, .max_recv_sge = 1,
			 .max_inline_data = 64 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = s->pd,
		.send_ops_flags = ops,
	};
	return ibv_create_qp_ex(s->ctx, &a);
}

/* Poll one completion of an extended CQ for at most 10 s (start_poll/end_poll around it):
 * 1 with its fields, or 0. */
struct got { uint64_t wr_id; int status, opcode; uint32_t byte_len, imm, qp_num, flags; };
static int poll_ex(struct ibv_cq_ex *cq, struct got *g)
{
	double end = now() + 10;
	struct ibv_poll_cq_attr pa = { 0 };
	while (now() < end) {
		int rc = ibv_start_poll(cq, &pa);
		if (rc == ENOENT)
			continue;
		if (rc != 0)
			return 0;
		g->wr_id = cq->wr_id;
		g->status = cq->status;
		g->opcode = ibv_wc_read_opcode(cq);
		g->byte_len = ibv_wc_read_byte_len(cq);
		g->flags = ibv_wc_read_wc_flags(cq);
		g->imm = (g->flags & IBV_WC_WITH_IMM) ? ntohl(ibv_wc_read_imm_data(cq)) : 0;
		g->qp_num = ibv_wc_read_qp_num(cq);
		ibv_end_poll(cq);
		return 1;
	}
	return 0;
}

/* Post one signaled RDMA WRITE on s's QP (old post API) and poll its completion from the
 * extended CQ: the status, or -1. */
static int write_ex(struct side *s, struct ibv_cq_ex *cq, uint64_t id, void *local, uint32_t len, uint64_t remote,
		    uint32_t rkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)local, .length = len, .lkey = s->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
	wr.wr.rdma.remote_addr = remote;
	wr.wr.rdma.rkey = rkey;
	if (ibv_post_send(s->qp, &wr, &bad))
		return -1;
	struct got g;
	if (!poll_ex(cq, &g) || g.wr_id != id)
		return -1;
	return g.status;
}

int main(void)
{
	int n = -1;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n == 2, "device list n=%d", n);
	if (!list || n != 2)
		return 1;
	struct side a, b;
	if (setup(&a, list[0], 1 << 16) || setup(&b, list[1], 1 << 16)) {
		printf("FAIL setup\n");
		return 1;
	}

	/* On-demand paging: reported, registered, prefetched (ibv_advise_mr). */
	struct ibv_device_attr_ex ax;
	CHECK(ibv_query_device_ex(a.ctx, NULL, &ax) == 0 && (ax.odp_caps.general_caps & IBV_ODP_SUPPORT) &&
	      !(ax.odp_caps.general_caps & IBV_ODP_SUPPORT_IMPLICIT) &&
	      (ax.odp_caps.per_transport_caps.rc_odp_caps & IBV_ODP_SUPPORT_ATOMIC), "odp caps");
	char *odp_buf = malloc(1 << 20);
	struct ibv_mr *odp = ibv_reg_mr(a.pd, odp_buf, 1 << 20, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
	CHECK(odp != NULL, "reg_mr ON_DEMAND");
	struct ibv_sge psge = { .addr = (uintptr_t)odp_buf + 4096, .length = 65536, .lkey = odp ? odp->lkey : 0 };
	CHECK(ibv_advise_mr(a.pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH, &psge, 1) == 0,
	      "advise_mr prefetch write");
	CHECK(ibv_advise_mr(a.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &psge, 1) == 0, "advise_mr prefetch");
	CHECK(ibv_advise_mr(a.pd, 7, 0, &psge, 1) == EINVAL, "advise_mr bad advice");
	CHECK(ibv_advise_mr(a.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &psge, 0) == EINVAL, "advise_mr no SGE");
	CHECK(ibv_advise_mr(b.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &psge, 1) == EINVAL, "advise_mr other PD");
	psge.length = 2 << 20;
	CHECK(ibv_advise_mr(a.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &psge, 1) == EINVAL, "advise_mr past the region");
	CHECK(odp && ibv_dereg_mr(odp) == 0, "dereg ODP region");
	free(odp_buf);

	/* A parent domain stands for its PD (the PD cannot go first); its regions work. A PD of
	 * its own, so that the parent domain is the only thing keeping it. */
	struct ibv_pd *base = ibv_alloc_pd(a.ctx);
	struct ibv_parent_domain_init_attr pda = { .pd = base };
	struct ibv_pd *pdom = base ? ibv_alloc_parent_domain(a.ctx, &pda) : NULL;
	CHECK(pdom != NULL && pdom != base, "alloc_parent_domain errno %d", errno);
	struct ibv_parent_domain_init_attr nested = { .pd = pdom };
	errno = 0;
	CHECK(ibv_alloc_parent_domain(a.ctx, &nested) == NULL && errno == EINVAL, "parent domain of a parent domain");
	struct ibv_mr *pmr = pdom ? ibv_reg_mr(pdom, a.buf, 4096, IBV_ACCESS_LOCAL_WRITE) : NULL;
	CHECK(pmr && pmr->pd == pdom && ibv_dereg_mr(pmr) == 0, "reg_mr on a parent domain");
	CHECK(ibv_dealloc_pd(base) == EBUSY, "the PD outlives its parent domain");
	CHECK(pdom && ibv_dealloc_pd(pdom) == 0 && ibv_dealloc_pd(base) == 0, "parent domain, then its PD, freed");

	/* Extended CQs: what is refused. */
	struct ibv_cq_init_attr_ex ca = { .cqe = 64, .wc_flags = IBV_WC_STANDARD_FLAGS };
	struct ibv_cq_init_attr_ex bad = ca;
	bad.wc_flags |= IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
	errno = 0;
	CHECK(ibv_create_cq_ex(a.ctx, &bad) == NULL && errno == EOPNOTSUPP, "cq_ex with timestamps errno %d", errno);
	bad = ca;
	bad.comp_vector = 1;
	errno = 0;
	CHECK(ibv_create_cq_ex(a.ctx, &bad) == NULL && errno == EINVAL, "cq_ex comp_vector 1 errno %d", errno);
	bad = ca;
	struct ibv_device_attr da;
	CHECK(ibv_query_device(a.ctx, &da) == 0, "query_device");
	bad.cqe = da.max_cqe + 1;
	errno = 0;
	CHECK(ibv_create_cq_ex(a.ctx, &bad) == NULL && errno == EINVAL, "cq_ex too deep errno %d", errno);
	struct ibv_cq_ex *cqa = ibv_create_cq_ex(a.ctx, &ca), *cqb = ibv_create_cq_ex(b.ctx, &ca);
	CHECK(cqa && cqb, "create_cq_ex errno %d", errno);
	if (!cqa || !cqb)
		return 1;
	struct ibv_poll_cq_attr pa = { 0 };
	CHECK(ibv_start_poll(cqa, &pa) == ENOENT, "start_poll on an empty CQ");
	CHECK(ibv_resize_cq(ibv_cq_ex_to_cq(cqa), 32) == 0 && ibv_cq_ex_to_cq(cqa)->cqe == 32 &&
	      ibv_resize_cq(ibv_cq_ex_to_cq(cqa), 64) == 0 && ibv_resize_cq(ibv_cq_ex_to_cq(cqa), 0) == EINVAL,
	      "resize_cq");
	pa.comp_mask = 1;
	CHECK(ibv_start_poll(cqa, &pa) == EINVAL, "start_poll with comp_mask bits");

	/* Extended QPs: what is refused, then a pair. */
	errno = 0;
	CHECK(qp_ex(&a, cqa, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_TSO) == NULL && errno == EOPNOTSUPP,
	      "qp_ex with TSO errno %d", errno);
	uint64_t ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE |
		       IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
		       IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV;
	ibv_destroy_qp(a.qp);
	ibv_destroy_qp(b.qp);
	a.qp = qp_ex(&a, cqa, ops);
	b.qp = qp_ex(&b, cqb, ops);
	CHECK(a.qp && b.qp, "create_qp_ex errno %d", errno);
	if (!a.qp || !b.qp || connect_qp(&a, &b) || connect_qp(&b, &a)) {
		printf("FAIL connect\n");
		return 1;
	}
	struct ibv_qp_ex *xa = ibv_qp_to_qp_ex(a.qp);
	CHECK(xa && (void *)xa == (void *)a.qp, "qp_to_qp_ex");

	/* SEND with immediate from two SGEs, then an inline SEND, in one batch. */
	struct ibv_sge rsge = { .addr = (uintptr_t)b.buf, .length = 4096, .lkey = b.mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 900, .sg_list = &rsge, .num_sge = 1 }, *rbad;
	CHECK(ibv_post_recv(b.qp, &rwr, &rbad) == 0, "post_recv");
	rwr.wr_id = 901;
	rsge.addr = (uintptr_t)(b.buf + 4096);
	CHECK(ibv_post_recv(b.qp, &rwr, &rbad) == 0, "post_recv 2");
	memcpy(a.buf, "hello, ", 7);
	memcpy(a.buf + 100, "extended", 8);
	struct ibv_sge two[2] = { { (uintptr_t)a.buf, 7, a.mr->lkey }, { (uintptr_t)(a.buf + 100), 8, a.mr->lkey } };
	ibv_wr_start(xa);
	xa->wr_id = 1;
	xa->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_imm(xa, htonl(0x12345678));
	ibv_wr_set_sge_list(xa, 2, two);
	xa->wr_id = 2;
	ibv_wr_send(xa);
	char inl[16] = "inline bytes";
	ibv_wr_set_inline_data(xa, inl, 12);
	memset(inl, 0, sizeof(inl)); /* copied by the call */
	CHECK(ibv_wr_complete(xa) == 0, "wr_complete");
	struct got g;
	CHECK(poll_ex(cqa, &g) && g.wr_id == 1 && g.status == IBV_WC_SUCCESS && g.opcode == IBV_WC_SEND, "send 1 completion");
	CHECK(poll_ex(cqa, &g) && g.wr_id == 2 && g.status == IBV_WC_SUCCESS, "send 2 completion");
	CHECK(poll_ex(cqb, &g) && g.wr_id == 900 && g.status == IBV_WC_SUCCESS && g.opcode == IBV_WC_RECV && g.byte_len == 15 &&
	      (g.flags & IBV_WC_WITH_IMM) && g.imm == 0x12345678 && g.qp_num == b.qp->qp_num,
	      "recv 1: len %u imm %x flags %x", g.byte_len, g.imm, g.flags);
	CHECK(memcmp(b.buf, "hello, extended", 15) == 0, "recv 1 data");
	CHECK(poll_ex(cqb, &g) && g.wr_id == 901 && g.byte_len == 12 && !(g.flags & IBV_WC_WITH_IMM), "recv 2");
	CHECK(memcmp(b.buf + 4096, "inline bytes", 12) == 0, "recv 2 data");

	/* WRITE, READ and both atomics, one batch. */
	memset(a.buf, 0xab, 256);
	uint64_t *counter = (uint64_t *)(b.buf + 8192);
	*counter = 40;
	ibv_wr_start(xa);
	xa->wr_flags = IBV_SEND_SIGNALED;
	xa->wr_id = 10;
	ibv_wr_rdma_write(xa, b.mr->rkey, (uintptr_t)(b.buf + 12288));
	ibv_wr_set_sge(xa, a.mr->lkey, (uintptr_t)a.buf, 256);
	xa->wr_id = 11;
	ibv_wr_rdma_read(xa, b.mr->rkey, (uintptr_t)(b.buf + 12288));
	ibv_wr_set_sge(xa, a.mr->lkey, (uintptr_t)(a.buf + 1024), 256);
	xa->wr_id = 12;
	ibv_wr_atomic_fetch_add(xa, b.mr->rkey, (uintptr_t)counter, 2);
	ibv_wr_set_sge(xa, a.mr->lkey, (uintptr_t)(a.buf + 2048), 8);
	xa->wr_id = 13;
	ibv_wr_atomic_cmp_swp(xa, b.mr->rkey, (uintptr_t)counter, 42, 100);
	ibv_wr_set_sge(xa, a.mr->lkey, (uintptr_t)(a.buf + 2056), 8);
	CHECK(ibv_wr_complete(xa) == 0, "wr_complete rdma");
	for (uint64_t id = 10; id <= 13; id++)
		CHECK(poll_ex(cqa, &g) && g.wr_id == id && g.status == IBV_WC_SUCCESS, "rdma completion %llu: status %d",
		      (unsigned long long)id, g.status);
	CHECK(memcmp(a.buf + 1024, a.buf, 256) == 0, "READ back what was written");
	CHECK(*(uint64_t *)(a.buf + 2048) == 40 && *(uint64_t *)(a.buf + 2056) == 42 && *counter == 100,
	      "atomics: %llu %llu %llu", (unsigned long long)*(uint64_t *)(a.buf + 2048),
	      (unsigned long long)*(uint64_t *)(a.buf + 2056), (unsigned long long)*counter);

	/* An aborted batch posts nothing; a misused builder poisons the batch. */
	ibv_wr_start(xa);
	xa->wr_id = 20;
	ibv_wr_rdma_write(xa, b.mr->rkey, (uintptr_t)b.buf);
	ibv_wr_abort(xa);
	ibv_wr_start(xa);
	ibv_wr_set_sge(xa, a.mr->lkey, (uintptr_t)a.buf, 8); /* no request started */
	CHECK(ibv_wr_complete(xa) == EINVAL, "a setter before any builder");
	ibv_wr_start(xa);
	xa->wr_id = 21;
	ibv_wr_send(xa);
	static char big[8192];
	ibv_wr_set_inline_data(xa, big, sizeof(big)); /* past max_inline_data (at most 4096) */
	CHECK(ibv_wr_complete(xa) == EINVAL, "inline data past max_inline_data");
	ibv_wr_start(xa);
	ibv_wr_send_tso(xa, big, 16, 1000);
	CHECK(ibv_wr_complete(xa) == EOPNOTSUPP, "TSO");
	struct ibv_poll_cq_attr pz = { 0 };
	CHECK(ibv_start_poll(cqa, &pz) == ENOENT, "nothing posted by the refused batches");

	/* A type 2 window bound with ibv_wr_bind_mw; the peer WRITEs through it; LOCAL_INV. */
	struct ibv_mr *host = ibv_reg_mr(a.pd, a.buf + 32768, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	struct ibv_mw *mw2 = ibv_alloc_mw(a.pd, IBV_MW_TYPE_2);
	CHECK(host && mw2, "mr and type 2 mw");
	uint32_t key2 = ibv_inc_rkey(mw2->rkey);
	struct ibv_mw_bind_info bi = { .mr = host, .addr = (uintptr_t)(a.buf + 32768), .length = 4096,
				       .mw_access_flags = IBV_ACCESS_REMOTE_WRITE };
	ibv_wr_start(xa);
	xa->wr_id = 30;
	ibv_wr_bind_mw(xa, mw2, key2, &bi);
	CHECK(ibv_wr_complete(xa) == 0, "wr_bind_mw");
	CHECK(poll_ex(cqa, &g) && g.wr_id == 30 && g.status == IBV_WC_SUCCESS && g.opcode == IBV_WC_BIND_MW,
	      "bind completion: status %d opcode %d", g.status, g.opcode);
	memcpy(b.buf + 20000, "through the window", 18);
	CHECK(write_ex(&b, cqb, 40, b.buf + 20000, 18, (uintptr_t)(a.buf + 32768 + 100), key2) == IBV_WC_SUCCESS,
	      "peer WRITE through the window");
	CHECK(memcmp(a.buf + 32768 + 100, "through the window", 18) == 0, "the window's bytes");

	/* A type 1 window: ibv_bind_mw is a work request that completes, in order. */
	struct ibv_mw *mw1 = ibv_alloc_mw(a.pd, IBV_MW_TYPE_1);
	struct ibv_mw_bind mb = { .wr_id = 50, .send_flags = IBV_SEND_SIGNALED, .bind_info = bi };
	uint32_t old1 = mw1 ? mw1->rkey : 0;
	CHECK(mw1 && ibv_bind_mw(a.qp, mw1, &mb) == 0 && mw1->rkey != old1, "bind type 1");
	CHECK(poll_ex(cqa, &g) && g.wr_id == 50 && g.status == IBV_WC_SUCCESS && g.opcode == IBV_WC_BIND_MW,
	      "type 1 bind completion: status %d", g.status);
	CHECK(write_ex(&b, cqb, 41, b.buf, 8, (uintptr_t)(a.buf + 32768), mw1->rkey) == IBV_WC_SUCCESS,
	      "peer WRITE through the type 1 window");
	mb.wr_id = 51;
	mb.bind_info.length = 0; /* unbind */
	CHECK(ibv_bind_mw(a.qp, mw1, &mb) == 0, "unbind type 1");
	CHECK(poll_ex(cqa, &g) && g.wr_id == 51 && g.status == IBV_WC_SUCCESS, "type 1 unbind completion");

	/* LOCAL_INV of the type 2 window: the peer's next WRITE through it is refused. */
	ibv_wr_start(xa);
	xa->wr_id = 60;
	ibv_wr_local_inv(xa, key2);
	CHECK(ibv_wr_complete(xa) == 0, "wr_local_inv");
	CHECK(poll_ex(cqa, &g) && g.wr_id == 60 && g.status == IBV_WC_SUCCESS && g.opcode == IBV_WC_LOCAL_INV, "local inv");
	CHECK(write_ex(&b, cqb, 42, b.buf, 8, (uintptr_t)(a.buf + 32768), key2) == IBV_WC_REM_ACCESS_ERR,
	      "peer WRITE through the invalidated window");

	CHECK(ibv_dealloc_mw(mw1) == 0 && ibv_dealloc_mw(mw2) == 0 && ibv_dereg_mr(host) == 0, "windows");
	for (struct side *s = &a; s; s = s == &a ? &b : NULL) {
		CHECK(ibv_destroy_qp(s->qp) == 0, "destroy_qp");
		s->qp = NULL;
	}
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cqa)) == 0 && ibv_destroy_cq(ibv_cq_ex_to_cq(cqb)) == 0, "destroy cq_ex");
	for (struct side *s = &a; s; s = s == &a ? &b : NULL) {
		CHECK(ibv_destroy_cq(s->cq) == 0 && ibv_dereg_mr(s->mr) == 0 && ibv_dealloc_pd(s->pd) == 0 &&
		      ibv_close_device(s->ctx) == 0, "teardown");
		free(s->buf);
	}
	ibv_free_device_list(list);
	if (failures)
		return 1;
	printf("ALL OK\n");
	return 0;
}
