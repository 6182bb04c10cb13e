//! Invalidation of a region in use: the endpoint tears down every QP using it (seed 001: "the
//! RDMA Device driver [...] could probably declare an access violation and tear all the
//! connections using it down") and tells the application.
//!
//! Two reports reach the device from the memory table (the engine routes them here,
//! [`Engine::watch_invalidations`](crate::net::Engine::watch_invalidations)). An invalidation
//! (from the watcher thread, or from the thread whose access found the memory gone) is queued
//! and the driver woken; the driver then, with no lock held, locks each QP in turn and asks the
//! transport whether it uses the region ([`Qp::uses_region`](crate::rc::Qp::uses_region)).
//! Those that do get [`Qp::access_violation`](crate::rc::Qp::access_violation) and are driven
//! at once, so that the NAK ending a message in progress leaves and the flushed completions
//! reach the CQs. And an access by a QP that met an invalidated key or vanished memory (the
//! QP's own packet or WR came first, and the transport moved it to the error state): it is
//! reported too once it is in the error state. Either way each QP gets one
//! [`AsyncEvent::QpAccessError`].

use std::sync::PoisonError;
use std::sync::atomic::Ordering;

use super::{Endpoint, EndpointIo, QpCell};
use crate::mem::Invalidation;
use crate::net::async_event::AsyncEvent;
use crate::rc::QpState;

/// What the memory table reported.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Gone {
    /// A region became unusable.
    Region(Invalidation),
    /// QP `qpn`'s access through `key` met an invalidated key or vanished memory.
    Access { qpn: u32, key: u32 },
}

impl Endpoint {
    /// Queue `g` for the driver's next [`Endpoint::tear_down_users`] (the caller wakes it).
    /// Takes no QP lock (the caller may hold one).
    pub(crate) fn note_gone(&self, g: Gone) {
        let mut q = self
            .invalidated
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Bounded: a flood of failing accesses needs no more than one report per QP.
        if q.len() < crate::mem::INVALIDATION_QUEUE {
            q.push(g);
        }
        drop(q);
        self.invalidations_pending.store(true, Ordering::Release);
    }

    /// True when invalidations wait for [`Endpoint::tear_down_users`].
    pub fn invalidations_pending(&self) -> bool {
        self.invalidations_pending.load(Ordering::Relaxed)
    }

    /// Tear down the QPs using each region invalidated since the last call, and report the
    /// QPs an access violation ended; returns how many QPs this moved to the error state.
    /// Called by the driver with no lock held.
    pub fn tear_down_users(&self, io: &impl EndpointIo) -> usize {
        if !self.invalidations_pending.swap(false, Ordering::AcqRel) {
            return 0;
        }
        let gone = std::mem::take(
            &mut *self
                .invalidated
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        let mut torn = 0;
        for g in gone {
            match g {
                Gone::Region(inv) => torn += self.tear_down_region(inv, io),
                Gone::Access { qpn, key } => {
                    let Some(cell) = self.cell(qpn) else { continue };
                    // The QP's lock is released before the report (whose hook may take locks
                    // of its own).
                    let ended = cell.lock().qp.state() == QpState::Err;
                    if ended {
                        self.report_violation(&cell, key);
                    }
                }
            }
        }
        torn
    }

    fn tear_down_region(&self, inv: Invalidation, io: &impl EndpointIo) -> usize {
        self.events.push(AsyncEvent::RegionInvalidated {
            lkey: inv.lkey,
            cause: inv.cause,
        });
        let cells: Vec<_> = self
            .qps
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        let names = |k: u32| self.mem.key_reaches_region(k, inv.lkey);
        let mut torn = 0;
        for cell in cells {
            let mut body = cell.lock();
            if !body.qp.uses_region(&names) {
                continue;
            }
            let nak = body.qp.access_violation(&names);
            tracing::info!(
                qp_num = cell.qpn,
                lkey = inv.lkey,
                nak,
                "QP used an invalidated region"
            );
            self.drive(&cell, &mut body, io.now(), io);
            drop(body);
            torn += 1;
            self.report_violation(&cell, inv.lkey);
        }
        torn
    }

    /// A work request of QP `qpn` completed in error (its completion was just polled): one
    /// `AsyncEvent::QpFatal` per QP, none once its `QpAccessError` was reported (the C ABI
    /// reports `IBV_EVENT_QP_FATAL` or `IBV_EVENT_QP_ACCESS_ERR`, whichever comes first). Takes
    /// no QP lock.
    pub fn report_fatal(&self, qpn: u32) {
        let Some(cell) = self.cell(qpn) else { return };
        if !cell.violation_reported.load(Ordering::Acquire)
            && !cell.fatal_reported.swap(true, Ordering::AcqRel)
        {
            self.events.push(AsyncEvent::QpFatal { qp_num: qpn });
        }
    }

    /// One `QpAccessError` per QP (counted in `access_violations`).
    fn report_violation(&self, cell: &QpCell, lkey: u32) {
        if !cell.violation_reported.swap(true, Ordering::AcqRel) {
            self.counters
                .access_violations
                .fetch_add(1, Ordering::Relaxed);
            self.events.push(AsyncEvent::QpAccessError {
                qp_num: cell.qpn,
                lkey,
            });
        }
    }
}
