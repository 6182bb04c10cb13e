//! A QP's post inbox: a send work request posted while another thread holds the QP (the
//! engine thread sending a window's worth of packets after an acknowledgement, or a poller
//! handling the QP's datagrams) is checked and queued without waiting for the lock, as a NIC
//! takes a doorbell while it transmits. The holder moves the inbox into the send queue
//! ([`Endpoint::absorb_inbox`]) before anything else it posts and whenever it drives the
//! QP, and the poster hands the QP to the driver when it cannot take it itself
//! ([`Engine::inbox_posted`](crate::net::Engine::inbox_posted)).
//!
//! Two things make a post through the inbox answer as a locked one would:
//! - **Its checks.** The holder publishes the QP's [`PostRules`] (state, caps, type, MTU) to
//!   the inbox whenever they change, before it unlocks. A request they refuse, or any post
//!   while they are unknown, takes the lock instead, and gets the exact answer there.
//! - **The send queue's room.** `sq_used` counts the slots taken, in the send queue and in
//!   the inbox; every post takes one first (a compare-and-swap against the depth), and
//!   slots of completed requests are given back under the lock before their completions
//!   reach the CQ. It is never below the true count, so the inbox never takes more than the
//!   queue holds; an inbox post that finds no room takes the lock, where the count is exact
//!   (the `ENOMEM` a full queue answers comes only from there).

use std::sync::atomic::Ordering;

use super::{Endpoint, QpBody, QpCell};
use crate::rc::{PostError, PostRules, SendFlags, SendWr, SgList, UdDest, WrOpcode};

/// Send work requests posted to a QP while it was held, in post order.
#[derive(Debug, Default)]
pub struct Inbox {
    /// The QP's rules as its holder last published them (None: not yet known).
    rules: Option<PostRules>,
    /// The requests: the first `len` are waiting; the rest keep their inline buffers for
    /// reuse.
    wrs: Vec<InboxWr>,
    len: usize,
}

/// A send work request kept by the inbox (the caller's lists and inline data copied).
#[derive(Debug)]
struct InboxWr {
    wr_id: u64,
    opcode: WrOpcode,
    flags: SendFlags,
    sges: SgList,
    inline: Vec<u8>,
    has_inline: bool,
    ud: Option<UdDest>,
}

impl InboxWr {
    fn set(&mut self, wr: &SendWr<'_>, sges: SgList) {
        self.wr_id = wr.wr_id;
        self.opcode = wr.opcode;
        self.flags = wr.send_flags;
        self.sges = sges;
        self.inline.clear();
        self.has_inline = wr.inline_data.is_some();
        if let Some(d) = wr.inline_data {
            self.inline.extend_from_slice(d);
        }
        self.ud = wr.ud;
    }

    fn as_wr(&self) -> SendWr<'_> {
        SendWr {
            wr_id: self.wr_id,
            opcode: self.opcode,
            send_flags: self.flags,
            sg_list: self.sges.as_slice(),
            inline_data: self.has_inline.then_some(self.inline.as_slice()),
            ud: self.ud,
        }
    }
}

impl QpCell {
    /// Post `wr` through the inbox: true when it was checked and queued (the caller then
    /// calls [`Engine::inbox_posted`](crate::net::Engine::inbox_posted) once it has posted
    /// all it posts now), false when the caller must take the lock and post there instead
    /// (the rules are unknown or refuse it, or the send queue may be full).
    pub fn inbox_post(&self, wr: &SendWr<'_>) -> bool {
        let mut inbox = self.inbox.lock().unwrap_or_else(|e| e.into_inner());
        let Some(rules) = inbox.rules else {
            return false;
        };
        let Ok((sges, _)) = rules.check(wr) else {
            return false;
        };
        if !self.take_sq_slot() {
            return false;
        }
        let i = inbox.len;
        if i == inbox.wrs.len() {
            inbox.wrs.push(InboxWr {
                wr_id: 0,
                opcode: WrOpcode::Send,
                flags: SendFlags::default(),
                sges: SgList::default(),
                inline: Vec::new(),
                has_inline: false,
                ud: None,
            });
        }
        inbox.wrs[i].set(wr, sges);
        inbox.len = i + 1;
        self.inbox_len.fetch_add(1, Ordering::SeqCst);
        true
    }

    /// Take a send-queue slot: false when all `sq_depth` are taken.
    pub(crate) fn take_sq_slot(&self) -> bool {
        self.sq_used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| {
                (u < self.sq_depth).then_some(u + 1)
            })
            .is_ok()
    }

    /// Give back `n` send-queue slots.
    fn give_sq_slots(&self, n: u32) {
        if n > 0 {
            let _ = self
                .sq_used
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| {
                    Some(u.saturating_sub(n))
                });
        }
    }

    /// Publish the QP's post rules to the inbox if they changed (the QP is locked: `body`).
    pub(super) fn publish_rules(&self, body: &mut QpBody) {
        let r = body.qp.post_rules();
        if body.rules_published != Some(r) {
            body.rules_published = Some(r);
            self.inbox.lock().unwrap_or_else(|e| e.into_inner()).rules = Some(r);
        }
    }

    /// Give back the slots of requests that left the send queue since the last look (the QP
    /// is locked: `body`).
    pub(super) fn sync_sq_slots(&self, body: &mut QpBody) {
        let n = u32::try_from(body.qp.send_queue_len()).unwrap_or(u32::MAX);
        if n < body.sq_counted {
            self.give_sq_slots(body.sq_counted - n);
            body.sq_counted = n;
        }
    }

    /// Requests waiting in the inbox.
    pub fn inbox_len(&self) -> usize {
        self.inbox_len.load(Ordering::SeqCst)
    }
}

impl Endpoint {
    /// Move the requests waiting in `cell`'s inbox into its send queue, in order (the QP is
    /// locked: `body`). A request the QP no longer takes (it was reset or modified between
    /// the post and now, a race of the application's own) is dropped and counted in
    /// `posts_dropped`. Returns the requests moved.
    pub fn absorb_inbox(&self, cell: &QpCell, body: &mut QpBody) -> usize {
        if cell.inbox_len.load(Ordering::SeqCst) == 0 {
            return 0;
        }
        let mut inbox = cell.inbox.lock().unwrap_or_else(|e| e.into_inner());
        let n = inbox.len;
        let mut dropped = 0;
        for w in &inbox.wrs[..n] {
            match body.qp.post_send(&w.as_wr()) {
                Ok(()) => body.sq_counted += 1,
                Err(_) => dropped += 1,
            }
        }
        inbox.len = 0;
        cell.inbox_len.fetch_sub(n, Ordering::SeqCst);
        drop(inbox);
        if dropped > 0 {
            cell.give_sq_slots(dropped);
            self.counters
                .posts_dropped
                .fetch_add(u64::from(dropped), Ordering::Relaxed);
        }
        n
    }

    /// Post one send work request to a locked QP (after the requests waiting in its inbox);
    /// the caller drives it. A refused request changes nothing.
    pub fn post_locked(
        &self,
        cell: &QpCell,
        body: &mut QpBody,
        wr: &SendWr<'_>,
    ) -> Result<(), PostError> {
        self.absorb_inbox(cell, body);
        cell.sync_sq_slots(body);
        if !cell.take_sq_slot() {
            // The state's answer first, as the transport gives it.
            body.qp.post_rules().check_state()?;
            return Err(PostError::QueueFull);
        }
        match body.qp.post_send(wr) {
            Ok(()) => {
                body.sq_counted += 1;
                Ok(())
            }
            Err(e) => {
                cell.give_sq_slots(1);
                Err(e)
            }
        }
    }
}
