/* Misuse of the C API through verbs.h (inline wrappers, macros) against softrdma's
 * libibverbs.so.1: every case must return the documented error, never crash. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

static int failures;
#define CHECK(cond, ...) do { if (!(cond)) { failures++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)

int main(void)
{
	int n = -1;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n == 2, "device list %p n=%d", (void *)list, n);
	if (!list)
		return 1;
	CHECK(strcmp(ibv_get_device_name(list[1]), "softrdma1") == 0, "name");
	CHECK(list[2] == NULL, "list not NULL-terminated");

	errno = 0;
	CHECK(ibv_open_device(NULL) == NULL && errno == EINVAL, "open NULL errno=%d", errno);
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx != NULL, "open");
	if (!ctx)
		return 1;

	/* Extended verbs: the context is extended (abi_compat = UINTPTR_MAX); verbs.h calls the slots
	 * softrdma fills (query_device_ex, the device-memory verbs) and falls back or fails with
	 * EOPNOTSUPP where a slot is NULL. */
	struct ibv_device_attr_ex ax;
	CHECK(ibv_query_device_ex(ctx, NULL, &ax) == 0, "query_device_ex");
	CHECK(ax.max_dm_size > 0 && ax.phys_port_cnt_ex == 1, "query_device_ex: extended fields");
	struct ibv_query_device_ex_input in = { .comp_mask = 1 };
	CHECK(ibv_query_device_ex(ctx, &in, &ax) == EINVAL, "query_device_ex unknown input");
	CHECK(ax.orig_attr.atomic_cap == IBV_ATOMIC_HCA, "atomic_cap");
	CHECK(ax.orig_attr.phys_port_cnt == 1, "port count");
	struct ibv_port_attr pa;
	CHECK(ibv_query_port(ctx, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE, "query_port");
	CHECK(pa.link_layer == IBV_LINK_LAYER_ETHERNET && pa.active_mtu == IBV_MTU_4096, "port attrs (loopback: 4096)");
	CHECK(ibv_query_port(ctx, 2, &pa) == EINVAL, "query_port bad port");
	union ibv_gid gid;
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0 && gid.raw[10] == 0xff && gid.raw[12] == 127 && gid.raw[15] == 1, "gid 0");
	CHECK(ibv_query_gid(ctx, 1, 1, &gid) == 0 && gid.raw[12] == 127, "gid 1");
	errno = 0;
	CHECK(ibv_query_gid(ctx, 1, 16, &gid) == -1 && errno == EINVAL, "gid 16");
	struct ibv_gid_entry ge;
	CHECK(ibv_query_gid_ex(ctx, 1, 0, &ge, 0) == 0 && ge.gid_type == IBV_GID_TYPE_ROCE_V2, "gid_ex");
	CHECK(ibv_query_gid_ex(ctx, 1, 5, &ge, 0) == ENODATA, "gid_ex empty");
	__be16 pkey;
	CHECK(ibv_query_pkey(ctx, 1, 0, &pkey) == 0 && pkey == 0xffff, "pkey");
	struct ibv_cq_init_attr_ex cqa = { .cqe = 16, .wc_flags = IBV_WC_EX_WITH_CVLAN };
	errno = 0;
	CHECK(ibv_create_cq_ex(ctx, &cqa) == NULL && errno == EOPNOTSUPP, "create_cq_ex with CVLAN errno=%d", errno);
	cqa.wc_flags = 0;
	struct ibv_cq_ex *cqx = ibv_create_cq_ex(ctx, &cqa);
	CHECK(cqx && ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)) == 0, "create_cq_ex errno=%d", errno);

	/* PD and MR. */
	errno = 0;
	CHECK(ibv_alloc_pd(NULL) == NULL && errno == EINVAL, "alloc_pd NULL");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL, "alloc_pd");
	char *buf = malloc(65536);
	errno = 0;
	CHECK(ibv_reg_mr(NULL, buf, 65536, IBV_ACCESS_LOCAL_WRITE) == NULL && errno == EINVAL, "reg_mr NULL pd");
	errno = 0;
	CHECK(ibv_reg_mr(pd, NULL, 65536, IBV_ACCESS_LOCAL_WRITE) == NULL && errno == EINVAL, "reg_mr NULL addr");
	errno = 0;
	CHECK(ibv_reg_mr(pd, buf, 65536, IBV_ACCESS_REMOTE_WRITE) == NULL && errno == EINVAL, "REMOTE_WRITE without LOCAL_WRITE");
	/* perftest's flags: LOCAL_WRITE | REMOTE_WRITE | RELAXED_ORDERING (goes to ibv_reg_mr_iova2). */
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 65536, 0x100003);
	CHECK(mr && mr->lkey == mr->rkey && mr->addr == buf && mr->length == 65536 && mr->pd == pd, "reg_mr");
	struct ibv_mr *mr2 = ibv_reg_mr(pd, buf + 1, 100, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	CHECK(mr2 && mr2->lkey != mr->lkey, "overlapping reg_mr");
	uint32_t old_rkey = mr2->rkey;
	CHECK(ibv_rereg_mr(mr2, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE) == 0, "rereg access");
	CHECK(mr2->rkey == old_rkey && mr2->lkey == mr2->rkey, "rereg of the same memory keeps the keys");
	char *buf2 = malloc(4096);
	CHECK(buf2 && ibv_rereg_mr(mr2, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, buf2, 4096, 0) == 0, "rereg translation");
	CHECK(mr2->rkey != old_rkey && mr2->lkey == mr2->rkey && mr2->addr == buf2 && mr2->length == 4096, "rereg onto new memory issues new keys");
	CHECK(ibv_rereg_mr(mr2, 0x80, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT, "rereg bad flags");
	CHECK(ibv_dealloc_pd(pd) == EBUSY, "dealloc busy pd");
	CHECK(ibv_dereg_mr(mr2) == 0, "dereg");
	CHECK(ibv_dereg_mr(mr2) == EINVAL, "dereg twice");
	CHECK(ibv_dereg_mr(NULL) == EINVAL, "dereg NULL");

	/* QPs and CQs (phase 1: none can exist; phase 2 replaces these with real cases). */
	struct ibv_qp_init_attr qia = { .qp_type = IBV_QPT_RC, .cap = { 1, 1, 1, 1, 0 } };
	errno = 0;
	CHECK(ibv_create_qp(pd, &qia) == NULL && errno == EINVAL, "create_qp with NULL CQs");
	errno = 0;
	CHECK(ibv_create_qp(pd, NULL) == NULL && errno == EINVAL, "create_qp NULL attr");
	CHECK(ibv_destroy_cq(NULL) == EINVAL, "destroy_cq NULL");
	CHECK(ibv_destroy_qp(NULL) == EINVAL, "destroy_qp NULL");
	CHECK(ibv_modify_qp(NULL, NULL, 0) == EINVAL, "modify_qp NULL");
	errno = 0;
	CHECK(ibv_create_cq(ctx, 0, NULL, NULL, 0) == NULL && errno == EINVAL, "create_cq cqe 0");

	/* Completion channel: fd pollable, get_cq_event honours O_NONBLOCK. */
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	CHECK(ch && ch->fd >= 0 && ch->context == ctx, "comp channel");
	struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
	CHECK(poll(&pfd, 1, 0) == 0, "empty channel polls readable");
	struct ibv_cq *evcq; void *evctx;
	errno = 0;
	CHECK(ibv_get_cq_event(NULL, &evcq, &evctx) == -1 && errno == EINVAL, "get_cq_event NULL");
	ibv_ack_cq_events(NULL, 1); /* ignored */
	CHECK(ibv_destroy_comp_channel(ch) == 0, "destroy channel");
	CHECK(ibv_destroy_comp_channel(ch) == EINVAL, "destroy channel twice");

	/* Async events: the fd exists and polls empty. */
	pfd.fd = ctx->async_fd;
	CHECK(ctx->async_fd >= 0 && poll(&pfd, 1, 0) == 0, "async fd");

	CHECK(ibv_dereg_mr(mr) == 0, "dereg");
	CHECK(ibv_dealloc_pd(pd) == 0, "dealloc pd");
	CHECK(ibv_dealloc_pd(pd) == EINVAL, "dealloc twice");
	CHECK(ibv_close_device(ctx) == 0, "close");
	errno = 0;
	CHECK(ibv_close_device(ctx) == -1 && errno == EINVAL, "close twice");
	ibv_free_device_list(list);
	free(buf);
	free(buf2);
	if (failures)
		return 1;
	printf("ALL OK\n");
	return 0;
}
