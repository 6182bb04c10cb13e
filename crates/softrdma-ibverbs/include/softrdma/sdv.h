/* softrdma direct verbs: what softrdma's libibverbs.so.1 offers beyond the standard verbs, as
 * mlx5dv.h does for mlx5. Every call returns 0 or an errno value (EINVAL for a pointer the
 * library did not hand out, or already destroyed); none sets errno. The symbols carry the
 * version node SOFTRDMA_1.0 of libibverbs.so.1, so a program that uses them runs only on
 * softrdma (ibv_get_device_name() starting with "softrdma" tells the devices apart).
 *
 * Out-structs start with `size`: set it to sizeof(the struct) before the call; the library
 * fills min(size, its own size) bytes and sets `size` to that, so programs built against an
 * older or newer header keep working. See docs/IBVERBS.md and docs/COHERENCE.md. */
#ifndef SOFTRDMA_SDV_H
#define SOFTRDMA_SDV_H

#include <stdint.h>
#include <infiniband/verbs.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What an mremap() of a region's memory does (raw memory of ibv_reg_mr only). */
enum softrdma_remap_policy {
	SOFTRDMA_REMAP_INVALIDATE = 0, /* the region is invalidated (the default) */
	SOFTRDMA_REMAP_FOLLOW = 1,     /* same IOVA and keys at the new address */
};

enum softrdma_mr_state {
	SOFTRDMA_MR_ACTIVE = 0,
	SOFTRDMA_MR_SUSPENDED = 1,   /* softrdma_mr_suspend(): peers get RNR NAKs */
	SOFTRDMA_MR_INVALIDATED = 2, /* final: deregister and register again */
};

enum softrdma_mr_cause {
	SOFTRDMA_CAUSE_NONE = 0,
	SOFTRDMA_CAUSE_UNMAPPED = 1,  /* munmap, MAP_FIXED over it, a shrinking mremap */
	SOFTRDMA_CAUSE_DISCARDED = 2, /* madvise(MADV_DONTNEED / MADV_FREE / MADV_REMOVE) */
	SOFTRDMA_CAUSE_REMAPPED = 3,  /* mremap with SOFTRDMA_REMAP_INVALIDATE, or of a part */
	SOFTRDMA_CAUSE_FAULTED = 4,   /* an access to its memory faulted (state may be ACTIVE) */
	SOFTRDMA_CAUSE_VERB = 5,      /* invalidated by a verb (local invalidate, send with inv.) */
};

struct softrdma_mr_coherence {
	uint32_t size;         /* in: sizeof(struct softrdma_mr_coherence); out: bytes filled */
	uint32_t state;        /* enum softrdma_mr_state */
	uint32_t cause;        /* enum softrdma_mr_cause */
	uint32_t remap_policy; /* enum softrdma_remap_policy */
	uint32_t watched;      /* 1: the watcher (userfaultfd) watches its pages */
	uint32_t checked_copy; /* 1: its bytes are copied with kernel-checked copies */
	uint64_t iova;         /* the address peers and SGEs use; never changed by a resume */
	uint64_t addr;         /* host address of its bytes now (follows a resume or a move) */
	uint64_t length;
};

/* The device's counters, like a NIC's hardware counters. */
struct softrdma_counters {
	uint32_t size; /* in: sizeof(struct softrdma_counters); out: bytes filled */
	uint32_t reserved;
	/* datapath */
	uint64_t rx_datagrams;
	uint64_t rx_packets;
	uint64_t rx_bad;          /* bad ICRC or malformed headers */
	uint64_t rx_icrc_solved;
	uint64_t rx_unknown_qp;
	uint64_t rx_wrong_peer;
	uint64_t tx_datagrams;
	uint64_t tx_packets;
	uint64_t tx_errors;
	uint64_t tx_zero_copy;
	uint64_t thread_wakeups;
	uint64_t thread_receives;
	uint64_t timer_scans;
	/* memory */
	uint64_t regions;
	uint64_t windows;
	uint64_t pds;
	uint64_t pinned_bytes;
	uint64_t pin_refusals;
	uint64_t device_bytes;    /* device memory (ibv_alloc_dm) */
	uint64_t watched_regions;
	uint64_t unwatched_regions;
	uint64_t coherence_events;
	uint64_t watch_invalidations;
	uint64_t remaps_followed;
	uint64_t access_faults;
	uint64_t invalidations_dropped;
	/* QPs ended by an access violation: a region they used was invalidated, or their own
	 * access met vanished memory or an invalidated key (IBV_EVENT_QP_ACCESS_ERR each) */
	uint64_t access_violations;
};

/* One QP's transport counters (requester and responder sides). */
struct softrdma_qp_counters {
	uint32_t size; /* in: sizeof(struct softrdma_qp_counters); out: bytes filled */
	uint32_t reserved;
	uint64_t packets_sent;
	uint64_t packets_received;
	uint64_t packets_dropped;
	uint64_t retransmits;       /* requester: go-back-N restarts */
	uint64_t timeouts;
	uint64_t rnr_naks_received; /* requester: RNR NAKs met (e.g. a suspended region) */
	uint64_t seq_naks_received;
	uint64_t rerequests;
	uint64_t duplicates;        /* responder */
	uint64_t rnr_naks_sent;     /* responder: RNR NAKs sent */
	uint64_t seq_naks_sent;
	uint64_t naks_sent;
};

/* Suspend `mr`: returns once every placement into it that was in flight has finished; from
 * then on peers' WRITE, READ, atomic and SEND into it get RNR NAKs (retried as their
 * rnr_retry allows) and local work requests naming it wait. Idempotent. EINVAL: not a live
 * region, or an invalidated one. */
int softrdma_mr_suspend(struct ibv_mr *mr);

/* Resume a suspended `mr`. new_addr NULL: on the same memory. Otherwise on the `mr->length`
 * bytes at new_addr (which must stay mapped until the region is deregistered or resumed
 * elsewhere), with the same IOVA, lkey and rkey; mr->addr becomes new_addr. Moving the bytes
 * is the caller's job, while the region is suspended; the old memory is the caller's again
 * when this returns. SGEs and peers keep using the IOVA (see softrdma_mr_query_coherence).
 * EINVAL: not a live region, not suspended, or new memory for device memory (ibv_reg_dm_mr);
 * ENOMEM/EFAULT: the new memory cannot be pinned (the region stays suspended). */
int softrdma_mr_resume(struct ibv_mr *mr, void *new_addr);

/* What an mremap() of the region's memory does from now on. EINVAL: not a live region or an
 * unknown policy. */
int softrdma_mr_set_remap_policy(struct ibv_mr *mr, enum softrdma_remap_policy policy);
int softrdma_mr_get_remap_policy(struct ibv_mr *mr, enum softrdma_remap_policy *policy);

/* Where the region stands (see struct softrdma_mr_coherence). EINVAL: not a live region,
 * out NULL or out->size < 8. */
int softrdma_mr_query_coherence(struct ibv_mr *mr, struct softrdma_mr_coherence *out);

/* The counters of the device behind `context` (opens its engine, as the first PD does).
 * EINVAL: not an open context, out NULL or out->size < 8. */
int softrdma_query_counters(struct ibv_context *context, struct softrdma_counters *out);

/* The counters of `qp`. EINVAL: not a live QP, out NULL or out->size < 8. */
int softrdma_query_qp_counters(struct ibv_qp *qp, struct softrdma_qp_counters *out);

#ifdef __cplusplus
}
#endif

#endif /* SOFTRDMA_SDV_H */
