//! What the verbs do to a QP, as the device core does it: modify it (held acknowledgements
//! sent before it stops sending, its completions purged on RESET, its peer set from the
//! address vector), post to it and drive it, and take it out of the device.

use std::sync::Arc;

use super::{Endpoint, EndpointIo, QpCell};
use crate::rc::{ModifyError, PostError, QpAttr, QpAttrMask, QpState, RecvWr, SendWr};

impl Endpoint {
    /// Modify a QP (`ibv_modify_qp`) and drive it. Before it moves to the error state or
    /// RESET, the acknowledgements it holds go out: the peer may be waiting for them (as
    /// `rdma_disconnect` moves the QP to the error state right after the application saw its
    /// last receive). On RESET its completions still in the CQs go with its queues (as
    /// rdma-core's providers clean the CQ), so a QP brought up again polls only its new work.
    /// An address vector names the peer (and the peer's source port is latched anew). A
    /// refused modify changes nothing.
    pub fn modify_qp(
        &self,
        cell: &Arc<QpCell>,
        attr: &QpAttr,
        mask: QpAttrMask,
        io: &impl EndpointIo,
    ) -> Result<(), ModifyError> {
        let mut body = cell.lock();
        // Requests posted before the modify meet the QP as it was.
        self.absorb_inbox(cell, &mut body);
        let state = mask.contains(QpAttrMask::STATE).then_some(attr.qp_state);
        if matches!(state, Some(QpState::Err | QpState::Reset)) && body.qp.state() != attr.qp_state
        {
            self.flush_held(&mut body, io);
        }
        body.qp.modify(attr, mask)?;
        if state == Some(QpState::Reset) {
            cell.send_cq.purge_qp(cell.qpn);
            cell.recv_cq.purge_qp(cell.qpn);
        }
        if mask.contains(QpAttrMask::AV)
            && let Some(av) = attr.av
        {
            body.peer = Some(av.dest());
            body.peer_src_port = None;
        }
        self.drive(cell, &mut body, io.now(), io);
        Ok(())
    }

    /// Post one send work request and drive the QP: its packets go out before this returns
    /// (as far as the send window allows). A refused request changes nothing.
    pub fn post_send(
        &self,
        cell: &Arc<QpCell>,
        wr: &SendWr<'_>,
        io: &impl EndpointIo,
    ) -> Result<(), PostError> {
        let mut body = cell.lock();
        let res = self.post_locked(cell, &mut body, wr);
        self.drive(cell, &mut body, io.now(), io);
        res
    }

    /// Post send work requests in order under one lock of the QP and drive it once; stops at
    /// the first refused one and returns its index with the error (the earlier ones stay
    /// posted and are sent).
    pub fn post_send_list(
        &self,
        cell: &Arc<QpCell>,
        wrs: &[SendWr<'_>],
        io: &impl EndpointIo,
    ) -> Result<(), (usize, PostError)> {
        let mut body = cell.lock();
        let res = wrs
            .iter()
            .enumerate()
            .try_for_each(|(i, wr)| self.post_locked(cell, &mut body, wr).map_err(|e| (i, e)));
        self.drive(cell, &mut body, io.now(), io);
        res
    }

    /// Post a receive work request. In the error state it completes at once (flushed), and
    /// the completion reaches the CQ now. A refused request changes nothing.
    pub fn post_recv(&self, cell: &Arc<QpCell>, wr: &RecvWr<'_>) -> Result<(), PostError> {
        let mut body = cell.lock();
        body.qp.post_recv(wr)?;
        self.drain_completions(cell, &mut body);
        Ok(())
    }

    /// Take a QP out of the device (`ibv_destroy_qp`): no packet reaches it any more, the
    /// acknowledgements it holds go out (its peer may be waiting for them), and it moves to
    /// the error state, its work requests flushed to its CQs.
    pub fn destroy_qp(&self, cell: &Arc<QpCell>, io: &impl EndpointIo) {
        self.remove_qp(cell.qpn);
        let mut body = cell.lock();
        self.absorb_inbox(cell, &mut body);
        self.flush_held(&mut body, io);
        let attr = QpAttr {
            qp_state: QpState::Err,
            ..*body.qp.attr()
        };
        let _ = body.qp.modify(&attr, QpAttrMask::STATE);
        self.drive(cell, &mut body, io.now(), io);
    }
}
