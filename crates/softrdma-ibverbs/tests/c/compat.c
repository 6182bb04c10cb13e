/* The libibverbs functions softrdma answers without the feature behind them (rate conversions,
 * ECE, data-in-order, object import, L2 resolution, the kernel-ABI copy helpers, the old
 * ibv_register_driver), called through verbs.h against softrdma's libibverbs.so.1: each must
 * return what docs/IBVERBS.md says, with the documented errno, and never crash on NULL or
 * foreign pointers. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>
#include <infiniband/sa.h>
#include <rdma/ib_user_verbs.h>
#include <rdma/ib_user_sa.h>

/* <infiniband/marshall.h> is not installed by Debian's libibverbs-dev; these are its
 * declarations. */
void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr *dst, struct ib_uverbs_ah_attr *src);
void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr *dst, struct ib_uverbs_qp_attr *src);
void ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec *dst, struct ib_user_path_rec *src);
void ibv_copy_path_rec_to_kern(struct ib_user_path_rec *dst, struct ibv_sa_path_rec *src);

/* Only a compatibility version exists (no default): bind to it explicitly. */
void register_driver_1_1(const char *name, void *init);
__asm__(".symver register_driver_1_1, ibv_register_driver@IBVERBS_1.1");

static int failures;
#define CHECK(cond, ...) do { if (!(cond)) { failures++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)

static int all_bytes(const void *p, size_t n, unsigned char v)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++)
		if (b[i] != v)
			return 0;
	return 1;
}

int main(void)
{
	/* Rate conversions (the full tables are compared with Debian's library in
	 * tests/compat.rs; here: the ABI through verbs.h). */
	CHECK(ibv_rate_to_mult(IBV_RATE_5_GBPS) == 2, "rate_to_mult 5G");
	CHECK(ibv_rate_to_mult(IBV_RATE_1200_GBPS) == 480, "rate_to_mult 1200G");
	CHECK(ibv_rate_to_mult(IBV_RATE_14_GBPS) == -1, "rate_to_mult 14G (no multiple)");
	CHECK(ibv_rate_to_mult(IBV_RATE_MAX) == -1 && ibv_rate_to_mult((enum ibv_rate)99) == -1, "rate_to_mult unknown");
	CHECK(mult_to_ibv_rate(4) == IBV_RATE_10_GBPS && mult_to_ibv_rate(11) == IBV_RATE_28_GBPS, "mult_to_rate");
	CHECK(mult_to_ibv_rate(3) == IBV_RATE_MAX && mult_to_ibv_rate(-1) == IBV_RATE_MAX, "mult_to_rate unknown");
	CHECK(ibv_rate_to_mbps(IBV_RATE_25_GBPS) == 25781 && ibv_rate_to_mbps(IBV_RATE_100_GBPS) == 103125, "rate_to_mbps");
	CHECK(ibv_rate_to_mbps(IBV_RATE_MAX) == -1 && ibv_rate_to_mbps((enum ibv_rate)25) == -1, "rate_to_mbps unknown");
	CHECK(mbps_to_ibv_rate(850000) == IBV_RATE_800_GBPS && mbps_to_ibv_rate(2500) == IBV_RATE_2_5_GBPS, "mbps_to_rate");
	CHECK(mbps_to_ibv_rate(25000) == IBV_RATE_MAX && mbps_to_ibv_rate(0) == IBV_RATE_MAX, "mbps_to_rate unknown");

	/* The old provider entry point: nothing to register, nothing happens. */
	register_driver_1_1("softrdma-test", NULL);
	register_driver_1_1(NULL, NULL);

	/* Kernel-ABI copies (exact field mapping checked against Debian's in tests/compat.rs). */
	struct ib_uverbs_ah_attr kah;
	memset(&kah, 0, sizeof(kah));
	kah.grh.dgid[15] = 7;
	kah.grh.flow_label = 0x12345;
	kah.dlid = 0x99;
	kah.static_rate = IBV_RATE_40_GBPS;
	kah.is_global = 1;
	kah.port_num = 1;
	struct ibv_ah_attr ah;
	memset(&ah, 0xee, sizeof(ah));
	ibv_copy_ah_attr_from_kern(&ah, &kah);
	CHECK(ah.grh.dgid.raw[15] == 7 && ah.grh.flow_label == 0x12345 && ah.dlid == 0x99 &&
	      ah.static_rate == IBV_RATE_40_GBPS && ah.is_global == 1 && ah.port_num == 1, "copy_ah_attr_from_kern");
	struct ib_uverbs_qp_attr kqa;
	memset(&kqa, 0, sizeof(kqa));
	kqa.qp_state = IBV_QPS_RTS;
	kqa.cur_qp_state = IBV_QPS_RTR;
	kqa.path_mtu = IBV_MTU_1024;
	kqa.max_send_wr = 33;
	kqa.alt_ah_attr.port_num = 2;
	kqa.alt_timeout = 14;
	struct ibv_qp_attr qa;
	memset(&qa, 0, sizeof(qa));
	qa.qp_state = IBV_QPS_SQD;
	ibv_copy_qp_attr_from_kern(&qa, &kqa);
	CHECK(qa.qp_state == IBV_QPS_SQD && qa.cur_qp_state == IBV_QPS_RTR && qa.path_mtu == IBV_MTU_1024 &&
	      qa.cap.max_send_wr == 33 && qa.alt_ah_attr.port_num == 2 && qa.alt_timeout == 14,
	      "copy_qp_attr_from_kern (qp_state is left alone, as rdma-core does)");
	struct ibv_sa_path_rec pr, pr2;
	memset(&pr, 0, sizeof(pr));
	pr.sgid.raw[0] = 0xfe;
	pr.dlid = 0x1234;
	pr.mtu = IBV_MTU_4096;
	pr.preference = 3;
	struct ib_user_path_rec kpr;
	memset(&kpr, 0, sizeof(kpr));
	ibv_copy_path_rec_to_kern(&kpr, &pr);
	CHECK(kpr.sgid[0] == 0xfe && kpr.dlid == 0x1234 && kpr.mtu == IBV_MTU_4096 && kpr.preference == 3, "path_rec_to_kern");
	memset(&pr2, 0, sizeof(pr2));
	ibv_copy_path_rec_from_kern(&pr2, &kpr);
	CHECK(memcmp(&pr, &pr2, sizeof(pr)) == 0, "path_rec round trip");

	/* Imports need a kernel uverbs fd. */
	errno = 0;
	CHECK(ibv_import_device(-1) == NULL && errno == EINVAL, "import_device(-1) errno=%d", errno);
	errno = 0;
	CHECK(ibv_import_device(0) == NULL && errno == EOPNOTSUPP, "import_device(0) errno=%d", errno);

	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n == 2, "device list");
	if (!list || n < 1)
		return 1;
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx != NULL, "open");
	if (!ctx)
		return 1;
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL, "alloc_pd");
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(cq != NULL, "create_cq");
	struct ibv_qp_init_attr qia = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &qia);
	CHECK(qp != NULL, "create_qp errno=%d", errno);
	if (!pd || !cq || !qp)
		return 1;
	static char buf[4096];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr != NULL, "reg_mr");

	unsigned long junk[32];
	memset(junk, 0, sizeof(junk));
	void *foreign = junk;

	errno = 0;
	CHECK(ibv_import_pd(ctx, pd->handle) == NULL && errno == EOPNOTSUPP, "import_pd errno=%d", errno);
	errno = 0;
	CHECK(ibv_import_pd(NULL, 1) == NULL && errno == EINVAL, "import_pd NULL errno=%d", errno);
	errno = 0;
	CHECK(ibv_import_pd(foreign, 1) == NULL && errno == EINVAL, "import_pd foreign errno=%d", errno);
	errno = 0;
	CHECK(ibv_import_mr(pd, mr ? mr->handle : 0) == NULL && errno == EOPNOTSUPP, "import_mr errno=%d", errno);
	errno = 0;
	CHECK(ibv_import_mr(foreign, 1) == NULL && errno == EINVAL, "import_mr foreign errno=%d", errno);
	errno = 0;
	CHECK(ibv_import_dm(ctx, 1) == NULL && errno == EOPNOTSUPP, "import_dm errno=%d", errno);
	errno = 0;
	CHECK(ibv_import_dm(NULL, 1) == NULL && errno == EINVAL, "import_dm NULL errno=%d", errno);
	/* Unimports are void and have nothing to undo: our objects stay usable. */
	ibv_unimport_pd(NULL);
	ibv_unimport_pd(foreign);
	ibv_unimport_mr(NULL);
	ibv_unimport_mr(foreign);
	ibv_unimport_dm(NULL);
	ibv_unimport_dm(foreign);
	ibv_unimport_pd(pd);
	ibv_unimport_mr(mr);

	/* ECE. */
	struct ibv_ece ece;
	memset(&ece, 0x5a, sizeof(ece));
	errno = 0;
	CHECK(ibv_query_ece(qp, &ece) == EOPNOTSUPP && errno == EOPNOTSUPP, "query_ece");
	CHECK(all_bytes(&ece, sizeof(ece), 0x5a), "query_ece wrote its output");
	ece.vendor_id = 0x15b3;
	ece.options = 1;
	ece.comp_mask = 0;
	CHECK(ibv_set_ece(qp, &ece) == EOPNOTSUPP, "set_ece");
	CHECK(ibv_set_ece(NULL, &ece) == EINVAL && errno == EINVAL, "set_ece NULL qp");
	CHECK(ibv_set_ece(foreign, &ece) == EINVAL, "set_ece foreign qp");
	CHECK(ibv_query_ece(foreign, &ece) == EINVAL, "query_ece foreign qp");
	CHECK(ibv_query_ece(qp, NULL) == EINVAL, "query_ece NULL ece");

	/* Data-in-order: never guaranteed by softrdma (docs/IBVERBS.md). */
	CHECK(ibv_query_qp_data_in_order(qp, IBV_WR_RDMA_WRITE, 0) == 0, "data_in_order write");
	CHECK(ibv_query_qp_data_in_order(qp, IBV_WR_SEND, 0) == 0, "data_in_order send");
	CHECK(ibv_query_qp_data_in_order(qp, IBV_WR_RDMA_READ, 1) == 0, "data_in_order read caps");
	CHECK(ibv_query_qp_data_in_order(NULL, IBV_WR_RDMA_WRITE, 0) == 0, "data_in_order NULL");
	CHECK(ibv_query_qp_data_in_order(foreign, IBV_WR_RDMA_WRITE, 0) == 0, "data_in_order foreign");

	/* L2 resolution: no layer-2 view over UDP. */
	struct ibv_ah_attr dst = { .is_global = 1, .port_num = 1 };
	dst.grh.dgid.raw[10] = 0xff;
	dst.grh.dgid.raw[11] = 0xff;
	dst.grh.dgid.raw[12] = 127;
	dst.grh.dgid.raw[15] = 68;
	uint8_t mac[6];
	memset(mac, 0x77, sizeof(mac));
	uint16_t vid = 0x7777;
	errno = 0;
	CHECK(ibv_resolve_eth_l2_from_gid(ctx, &dst, mac, &vid) == -EOPNOTSUPP && errno == EOPNOTSUPP, "resolve_eth_l2");
	CHECK(all_bytes(mac, sizeof(mac), 0x77) && vid == 0x7777, "resolve_eth_l2 wrote its outputs");
	CHECK(ibv_resolve_eth_l2_from_gid(NULL, &dst, mac, &vid) == -EINVAL && errno == EINVAL, "resolve NULL ctx");
	CHECK(ibv_resolve_eth_l2_from_gid(foreign, &dst, mac, NULL) == -EINVAL, "resolve foreign ctx");
	CHECK(ibv_resolve_eth_l2_from_gid(ctx, NULL, mac, NULL) == -EINVAL, "resolve NULL attr");
	CHECK(ibv_resolve_eth_l2_from_gid(ctx, &dst, NULL, NULL) == -EINVAL, "resolve NULL mac");

	CHECK(all_bytes(junk, sizeof(junk), 0), "a foreign pointer was written through");

	/* Our objects survived the unimports. */
	CHECK(ibv_dereg_mr(mr) == 0, "dereg_mr after unimport");
	CHECK(ibv_destroy_qp(qp) == 0, "destroy_qp");
	CHECK(ibv_destroy_cq(cq) == 0, "destroy_cq");
	CHECK(ibv_dealloc_pd(pd) == 0, "dealloc_pd after unimport");
	CHECK(ibv_close_device(ctx) == 0, "close");
	ibv_free_device_list(list);

	if (failures) {
		printf("%d failures\n", failures);
		return 1;
	}
	printf("ALL OK\n");
	return 0;
}
