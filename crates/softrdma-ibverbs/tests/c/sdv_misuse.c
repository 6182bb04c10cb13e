/* softrdma's own calls (softrdma/sdv.h) through the library: bad pointers, resume without
 * suspend, the region's state through suspend, resume on new memory and an unmap, the
 * remap policy, and the size convention of the out-structs. Never a crash. */
#include <sys/mman.h>
#include <softrdma/sdv.h>
#include "pair.h"

static struct softrdma_mr_coherence query(struct ibv_mr *mr)
{
	struct softrdma_mr_coherence c = { .size = sizeof(c) };
	CHECK(softrdma_mr_query_coherence(mr, &c) == 0 && c.size == sizeof(c), "query_coherence");
	return c;
}

int main(void)
{
	int n = -1;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n == 2, "device list n=%d", n);
	if (!list || n != 2)
		return 1;
	struct side a, b;
	if (setup(&a, list[0], 65536) || setup(&b, list[1], 65536)) {
		printf("FAIL setup\n");
		return 1;
	}

	/* NULL and foreign pointers: EINVAL, and nothing written through them. */
	uint64_t junk[64] = { 0 };
	struct softrdma_mr_coherence c = { .size = sizeof(c) };
	struct softrdma_counters cnt = { .size = sizeof(cnt) };
	struct softrdma_qp_counters qc = { .size = sizeof(qc) };
	enum softrdma_remap_policy pol;
	CHECK(softrdma_mr_suspend(NULL) == EINVAL, "suspend NULL");
	CHECK(softrdma_mr_suspend((struct ibv_mr *)junk) == EINVAL, "suspend foreign");
	CHECK(softrdma_mr_resume(NULL, NULL) == EINVAL, "resume NULL");
	CHECK(softrdma_mr_resume((struct ibv_mr *)junk, junk) == EINVAL, "resume foreign");
	CHECK(softrdma_mr_set_remap_policy(NULL, SOFTRDMA_REMAP_FOLLOW) == EINVAL, "set policy NULL");
	CHECK(softrdma_mr_get_remap_policy((struct ibv_mr *)junk, &pol) == EINVAL, "get policy foreign");
	CHECK(softrdma_mr_query_coherence((struct ibv_mr *)junk, &c) == EINVAL, "coherence foreign");
	CHECK(softrdma_query_counters(NULL, &cnt) == EINVAL, "counters NULL");
	CHECK(softrdma_query_counters((struct ibv_context *)junk, &cnt) == EINVAL, "counters foreign");
	CHECK(softrdma_query_counters((struct ibv_context *)a.pd, &cnt) == EINVAL, "counters of a PD");
	CHECK(softrdma_query_qp_counters(NULL, &qc) == EINVAL, "qp counters NULL");
	CHECK(softrdma_query_qp_counters((struct ibv_qp *)a.mr, &qc) == EINVAL, "qp counters of an MR");
	CHECK(softrdma_mr_suspend((struct ibv_mr *)a.qp) == EINVAL, "suspend a QP");
	for (int i = 0; i < 64; i++)
		CHECK(junk[i] == 0, "a refused pointer was written through");
	/* NULL or too small out-structs. */
	CHECK(softrdma_mr_get_remap_policy(a.mr, NULL) == EINVAL, "get policy NULL out");
	CHECK(softrdma_mr_query_coherence(a.mr, NULL) == EINVAL, "coherence NULL out");
	c.size = 4;
	CHECK(softrdma_mr_query_coherence(a.mr, &c) == EINVAL, "coherence size 4");
	CHECK(softrdma_query_counters(a.ctx, NULL) == EINVAL, "counters NULL out");
	qc.size = 0;
	CHECK(softrdma_query_qp_counters(a.qp, &qc) == EINVAL, "qp counters size 0");

	/* A fresh region: active, the default policy, checked copies, IOVA = its address. */
	c = query(a.mr);
	CHECK(c.state == SOFTRDMA_MR_ACTIVE && c.cause == SOFTRDMA_CAUSE_NONE, "fresh state %u cause %u", c.state, c.cause);
	CHECK(c.remap_policy == SOFTRDMA_REMAP_INVALIDATE && c.checked_copy == 1, "fresh policy %u checked %u",
	      c.remap_policy, c.checked_copy);
	CHECK(c.iova == (uintptr_t)a.buf && c.addr == (uintptr_t)a.buf && c.length == 65536, "fresh iova/addr/length");
	printf("watched: %u\n", c.watched);

	/* Remap policy. */
	CHECK(softrdma_mr_set_remap_policy(a.mr, SOFTRDMA_REMAP_FOLLOW) == 0, "set follow");
	CHECK(softrdma_mr_get_remap_policy(a.mr, &pol) == 0 && pol == SOFTRDMA_REMAP_FOLLOW, "get follow");
	CHECK(softrdma_mr_set_remap_policy(a.mr, (enum softrdma_remap_policy)7) == EINVAL, "set policy 7");
	CHECK(softrdma_mr_get_remap_policy(a.mr, &pol) == 0 && pol == SOFTRDMA_REMAP_FOLLOW, "unchanged by a refusal");
	CHECK(softrdma_mr_set_remap_policy(a.mr, SOFTRDMA_REMAP_INVALIDATE) == 0, "set invalidate");

	/* Resume without suspend: EINVAL, the region and mr->addr unchanged. */
	char *other = calloc(1, 65536);
	uint32_t lkey = a.mr->lkey, rkey = a.mr->rkey;
	CHECK(softrdma_mr_resume(a.mr, NULL) == EINVAL, "resume without suspend");
	CHECK(softrdma_mr_resume(a.mr, other) == EINVAL && a.mr->addr == a.buf, "resume elsewhere without suspend");

	/* Suspend (twice: idempotent), then the peer's WRITE waits on RNR NAKs... */
	CHECK(softrdma_mr_suspend(a.mr) == 0 && softrdma_mr_suspend(a.mr) == 0, "suspend twice");
	c = query(a.mr);
	CHECK(c.state == SOFTRDMA_MR_SUSPENDED, "suspended state %u", c.state);
	CHECK(connect_qp(&a, &b) == 0 && connect_qp(&b, &a) == 0, "connect");
	memset(b.buf, 0x5c, 4096);
	struct ibv_sge sge = { .addr = (uintptr_t)b.buf, .length = 4096, .lkey = b.mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 5, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
	wr.wr.rdma.remote_addr = c.iova + 8192;
	wr.wr.rdma.rkey = rkey;
	CHECK(ibv_post_send(b.qp, &wr, &bad) == 0, "post write into the suspended region");
	double end = now() + 5;
	qc.size = sizeof(qc);
	while (now() < end && softrdma_query_qp_counters(b.qp, &qc) == 0 && qc.rnr_naks_received == 0)
		;
	CHECK(qc.size == sizeof(qc) && qc.rnr_naks_received > 0, "the peer met RNR NAKs: %llu",
	      (unsigned long long)qc.rnr_naks_received);
	struct ibv_wc wc;
	CHECK(ibv_poll_cq(b.cq, 1, &wc) == 0, "no completion while suspended");
	/* ... and goes on in the new memory after a resume there (keys and IOVA unchanged). */
	memcpy(other, a.buf, 65536);
	CHECK(softrdma_mr_resume(a.mr, other) == 0, "resume on new memory");
	CHECK(a.mr->addr == other && a.mr->lkey == lkey && a.mr->rkey == rkey, "mr after resume");
	CHECK(poll1(b.cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 5, "write after resume: %d", wc.status);
	CHECK(other[8192] == 0x5c && other[8192 + 4095] == 0x5c && a.buf[8192] == 0, "the bytes are in the new memory");
	c = query(a.mr);
	CHECK(c.state == SOFTRDMA_MR_ACTIVE && c.iova == (uintptr_t)a.buf && c.addr == (uintptr_t)other, "state after resume");
	CHECK(softrdma_mr_resume(a.mr, NULL) == EINVAL, "resume twice");
	struct softrdma_qp_counters aq = { .size = sizeof(aq) };
	CHECK(softrdma_query_qp_counters(a.qp, &aq) == 0 && aq.rnr_naks_sent > 0, "the owner sent RNR NAKs");

	/* Out-struct sizes: an older, shorter struct gets the fields that fit; a newer, longer
	 * one gets ours and the size says so. */
	struct { struct softrdma_mr_coherence c; uint64_t extra; } big;
	memset(&big, 0xee, sizeof(big));
	big.c.size = sizeof(big);
	CHECK(softrdma_mr_query_coherence(a.mr, &big.c) == 0 && big.c.size == sizeof(big.c) && big.extra == 0xeeeeeeeeeeeeeeeeull,
	      "longer struct: size %u", big.c.size);
	memset(&c, 0xee, sizeof(c));
	c.size = 12;
	CHECK(softrdma_mr_query_coherence(a.mr, &c) == 0 && c.size == 12 && c.state == SOFTRDMA_MR_ACTIVE &&
	      c.cause == SOFTRDMA_CAUSE_NONE && c.remap_policy == 0xeeeeeeee, "shorter struct: size %u", c.size);
	cnt.size = sizeof(cnt);
	CHECK(softrdma_query_counters(a.ctx, &cnt) == 0 && cnt.size == sizeof(cnt), "counters");
	CHECK(cnt.regions >= 1 && cnt.pds >= 1 && cnt.rx_packets > 0 && cnt.tx_packets > 0, "counter values: regions %llu rx %llu",
	      (unsigned long long)cnt.regions, (unsigned long long)cnt.rx_packets);

	/* An unmap of a watched region's memory invalidates it, with its cause; an invalidated
	 * region can be neither suspended nor resumed. */
	char *m = mmap(NULL, 65536, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct ibv_mr *um = ibv_reg_mr(a.pd, m, 65536, ALL_ACCESS);
	CHECK(um != NULL, "reg mmap");
	c = query(um);
	if (c.watched) {
		munmap(m, 65536);
		end = now() + 2;
		while (now() < end && query(um).state != SOFTRDMA_MR_INVALIDATED)
			;
		c = query(um);
		CHECK(c.state == SOFTRDMA_MR_INVALIDATED && c.cause == SOFTRDMA_CAUSE_UNMAPPED, "unmapped: state %u cause %u",
		      c.state, c.cause);
		CHECK(softrdma_mr_suspend(um) == EINVAL, "suspend an invalidated region");
		CHECK(softrdma_mr_resume(um, NULL) == EINVAL, "resume an invalidated region");
	} else {
		printf("the watcher is unavailable here: unmap case skipped\n");
		munmap(m, 65536);
	}
	CHECK(ibv_dereg_mr(um) == 0, "dereg unmapped");
	/* A deregistered region is unknown. */
	CHECK(softrdma_mr_suspend(um) == EINVAL && softrdma_mr_query_coherence(um, &c) == EINVAL, "after dereg");

	/* A suspended region can be deregistered. */
	CHECK(softrdma_mr_suspend(a.mr) == 0, "suspend before dereg");
	teardown(&a);
	teardown(&b);
	free(other);
	ibv_free_device_list(list);
	if (failures)
		return 1;
	printf("ALL OK\n");
	return 0;
}
