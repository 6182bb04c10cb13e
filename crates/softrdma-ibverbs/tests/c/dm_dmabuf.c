/* Device memory (ibv_alloc_dm, ibv_memcpy_to_dm/from_dm, ibv_reg_dm_mr, ibv_free_dm) and
 * fd-backed regions (ibv_reg_dmabuf_mr on a memfd) through verbs.h, with a peer's RDMA READ
 * and WRITE on them, their error paths, and a truncated memfd (an access error, no SIGBUS). */
#define _GNU_SOURCE
#include <sys/mman.h>
#include <unistd.h>
#include <softrdma/sdv.h>
#include "pair.h"

#define DM_LEN 65536
#define DB_OFF 4096
#define DB_LEN 65536
#define DB_IOVA 0x10000000ull

int main(void)
{
	int n = -1;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n == 2, "device list n=%d", n);
	if (!list || n != 2)
		return 1;
	struct side a, b;
	if (setup(&a, list[0], 1 << 20) || setup(&b, list[1], 1 << 20) || connect_qp(&a, &b) || connect_qp(&b, &a)) {
		printf("FAIL setup\n");
		return 1;
	}
	unsigned char *pat = malloc(DM_LEN);
	for (int i = 0; i < DM_LEN; i++)
		pat[i] = (unsigned char)(i * 7 + 3);

	/* The extended context: ibv_query_device_ex reaches the provider. */
	struct ibv_device_attr_ex ax;
	CHECK(ibv_query_device_ex(a.ctx, NULL, &ax) == 0 && ax.max_dm_size > 0 && ax.phys_port_cnt_ex == 1 &&
	      ax.orig_attr.phys_port_cnt == 1 && ax.orig_attr.atomic_cap == IBV_ATOMIC_HCA, "query_device_ex max_dm_size %llu",
	      (unsigned long long)ax.max_dm_size);

	/* Device memory: errors first. */
	struct ibv_alloc_dm_attr da = { .length = 0 };
	errno = 0;
	CHECK(ibv_alloc_dm(a.ctx, &da) == NULL && errno == EINVAL, "alloc_dm length 0 errno %d", errno);
	da.length = DM_LEN;
	da.comp_mask = 1;
	errno = 0;
	CHECK(ibv_alloc_dm(a.ctx, &da) == NULL && errno == EINVAL, "alloc_dm comp_mask errno %d", errno);
	da.comp_mask = 0;
	da.log_align_req = 30;
	errno = 0;
	CHECK(ibv_alloc_dm(a.ctx, &da) == NULL && errno == EINVAL, "alloc_dm alignment errno %d", errno);
	da.log_align_req = 6;
	errno = 0;
	CHECK(ibv_alloc_dm(a.ctx, NULL) == NULL && errno == EINVAL, "alloc_dm NULL attr");
	struct ibv_dm *dm = ibv_alloc_dm(a.ctx, &da);
	CHECK(dm != NULL && dm->context == a.ctx, "alloc_dm errno %d", errno);
	if (!dm)
		return 1;
	CHECK(ibv_memcpy_to_dm(dm, 0, pat, DM_LEN) == 0, "memcpy_to_dm");
	CHECK(ibv_memcpy_to_dm(dm, DM_LEN - 10, pat, 11) == EINVAL, "memcpy_to_dm past the end");
	CHECK(ibv_memcpy_to_dm(dm, UINT64_MAX, pat, 2) == EINVAL, "memcpy_to_dm wrapping");
	CHECK(ibv_memcpy_to_dm(dm, 0, NULL, 8) == EINVAL, "memcpy_to_dm NULL");
	unsigned char back[256];
	CHECK(ibv_memcpy_from_dm(back, dm, 100, sizeof(back)) == 0 && memcmp(back, pat + 100, sizeof(back)) == 0, "memcpy_from_dm");
	CHECK(ibv_memcpy_from_dm(back, dm, DM_LEN, 1) == EINVAL, "memcpy_from_dm past the end");
	unsigned int dacc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_ZERO_BASED;
	errno = 0;
	CHECK(ibv_reg_dm_mr(a.pd, dm, 0, 4096, dacc & ~IBV_ACCESS_ZERO_BASED) == NULL && errno == EINVAL, "reg_dm_mr without ZERO_BASED");
	errno = 0;
	CHECK(ibv_reg_dm_mr(a.pd, dm, 4096, DM_LEN, dacc) == NULL && errno == EINVAL, "reg_dm_mr past the end");
	/* A zero length registers an empty region (as mlx5 allows). */
	struct ibv_mr *empty = ibv_reg_dm_mr(a.pd, dm, 0, 0, dacc);
	CHECK(empty != NULL && empty->length == 0 && ibv_dereg_mr(empty) == 0, "reg_dm_mr length 0");
	CHECK(ibv_memcpy_to_dm(dm, 2, pat, 4) == EINVAL && ibv_memcpy_from_dm(back, dm, 0, 3) == EINVAL,
	      "DM copies not 4-byte aligned");
	errno = 0;
	CHECK(ibv_reg_dm_mr(b.pd, dm, 0, 4096, dacc) == NULL && errno == EINVAL, "reg_dm_mr PD of another context");
	struct ibv_mr *dmm = ibv_reg_dm_mr(a.pd, dm, 4096, 32768, dacc);
	CHECK(dmm != NULL && dmm->addr == (void *)4096 && dmm->length == 32768 && dmm->lkey == dmm->rkey, "reg_dm_mr errno %d", errno);
	if (!dmm)
		return 1;
	CHECK(ibv_free_dm(dm) == EBUSY, "free_dm with a region");
	/* The peer READs what memcpy_to_dm put there (zero-based: remote address 0 is DM offset 4096). */
	memset(b.buf, 0, 32768);
	CHECK(rdma(&b, IBV_WR_RDMA_READ, b.buf, b.mr->lkey, 32768, 0, dmm->rkey) == IBV_WC_SUCCESS, "peer READ of DM");
	CHECK(memcmp(b.buf, pat + 4096, 32768) == 0, "the peer read the DM's bytes");
	/* The peer WRITEs; memcpy_from_dm sees it. */
	for (int i = 0; i < 4096; i++)
		b.buf[i] = (char)(255 - i);
	CHECK(rdma(&b, IBV_WR_RDMA_WRITE, b.buf, b.mr->lkey, 4096, 1024, dmm->rkey) == IBV_WC_SUCCESS, "peer WRITE to DM");
	unsigned char got[4096];
	CHECK(ibv_memcpy_from_dm(got, dm, 4096 + 1024, 4096) == 0 && memcmp(got, b.buf, 4096) == 0, "memcpy_from_dm after the WRITE");
	/* Device memory cannot move; it can be suspended and resumed in place. */
	char spare[64];
	CHECK(softrdma_mr_suspend(dmm) == 0 && softrdma_mr_resume(dmm, spare) == EINVAL && softrdma_mr_resume(dmm, NULL) == 0,
	      "DM region suspend/resume");
	struct softrdma_counters cnt = { .size = sizeof(cnt) };
	CHECK(softrdma_query_counters(a.ctx, &cnt) == 0 && cnt.device_bytes >= DM_LEN, "device_bytes %llu",
	      (unsigned long long)cnt.device_bytes);
	CHECK(ibv_dereg_mr(dmm) == 0, "dereg DM region");
	CHECK(ibv_free_dm(dm) == 0, "free_dm");

	/* dma-buf regions on a memfd: errors first. */
	int fd = memfd_create("softrdma-test", MFD_CLOEXEC);
	CHECK(fd >= 0 && ftruncate(fd, 1 << 20) == 0, "memfd");
	unsigned char *view = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	CHECK(view != MAP_FAILED, "map the memfd");
	memcpy(view + DB_OFF, pat, DB_LEN);
	errno = 0;
	CHECK(ibv_reg_dmabuf_mr(a.pd, 0, 4096, 0, -1, ALL_ACCESS) == NULL && errno == EBADF, "dmabuf fd -1 errno %d", errno);
	errno = 0;
	CHECK(ibv_reg_dmabuf_mr(a.pd, 0, 4096, 0, 987, ALL_ACCESS) == NULL && errno == EBADF, "dmabuf closed fd errno %d", errno);
	errno = 0;
	CHECK(ibv_reg_dmabuf_mr(a.pd, (1 << 20) - 4096, 8192, 0, fd, ALL_ACCESS) == NULL && errno == EINVAL, "dmabuf past EOF errno %d", errno);
	errno = 0;
	CHECK(ibv_reg_dmabuf_mr(a.pd, 0, 0, 0, fd, ALL_ACCESS) == NULL && errno == EINVAL, "dmabuf length 0");
	errno = 0;
	CHECK(ibv_reg_dmabuf_mr(NULL, 0, 4096, 0, fd, ALL_ACCESS) == NULL && errno == EINVAL, "dmabuf NULL pd");
	errno = 0;
	CHECK(ibv_reg_dmabuf_mr(a.pd, UINT64_MAX - 10, 4096, 0, fd, ALL_ACCESS) == NULL && errno == EINVAL, "dmabuf offset wraps");
	struct ibv_mr *dbm = ibv_reg_dmabuf_mr(a.pd, DB_OFF, DB_LEN, DB_IOVA, fd, ALL_ACCESS);
	CHECK(dbm != NULL && dbm->addr == (void *)DB_OFF && dbm->length == DB_LEN, "reg_dmabuf_mr errno %d", errno);
	if (!dbm)
		return 1;
	/* The device holds its own descriptor and mapping: our fd can go at once. */
	int fd2 = dup(fd);
	close(fd);
	memset(b.buf, 0, DB_LEN);
	CHECK(rdma(&b, IBV_WR_RDMA_READ, b.buf, b.mr->lkey, DB_LEN, DB_IOVA, dbm->rkey) == IBV_WC_SUCCESS, "peer READ of dmabuf");
	CHECK(memcmp(b.buf, pat, DB_LEN) == 0, "the peer read the file's bytes");
	memset(b.buf, 0xa7, 8192);
	CHECK(rdma(&b, IBV_WR_RDMA_WRITE, b.buf, b.mr->lkey, 8192, DB_IOVA + 4096, dbm->rkey) == IBV_WC_SUCCESS, "peer WRITE to dmabuf");
	CHECK(view[DB_OFF + 4096] == 0xa7 && view[DB_OFF + 4096 + 8191] == 0xa7 && view[DB_OFF + 4095] == pat[4095],
	      "the WRITE is in the file");
	struct softrdma_mr_coherence c = { .size = sizeof(c) };
	CHECK(softrdma_mr_query_coherence(dbm, &c) == 0 && c.iova == DB_IOVA && c.state == SOFTRDMA_MR_ACTIVE, "dmabuf coherence");
	/* Truncated under the device's mapping: the peer's access fails, the process lives. */
	CHECK(munmap(view, 1 << 20) == 0 && ftruncate(fd2, 4096) == 0, "truncate");
	int st = rdma(&b, IBV_WR_RDMA_READ, b.buf, b.mr->lkey, 4096, DB_IOVA + 8192, dbm->rkey);
	CHECK(st == IBV_WC_REM_ACCESS_ERR, "READ of a truncated file: status %d", st);
	CHECK(ibv_dereg_mr(dbm) == 0, "dereg dmabuf region");
	close(fd2);

	/* The peer's QP is in error now: its teardown still works. */
	teardown(&a);
	teardown(&b);
	free(pat);
	ibv_free_device_list(list);
	if (failures)
		return 1;
	printf("ALL OK\n");
	return 0;
}
