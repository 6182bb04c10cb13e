//! The connection manager between two devices over real UDP on loopback: connect, accept,
//! data over the connected RC QPs, disconnect from either side; no listener; consumer reject.

use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc;
use std::time::Duration;

use softrdma::verbs::*;
use softrdma::wire::cm::rej_reason;

const T: Duration = Duration::from_secs(10);

fn device(ip: [u8; 4], port: u16) -> Device {
    let mut cfg = DeviceConfig::new(IpAddr::from(ip));
    cfg.port = port;
    cfg.pin_mode = PinMode::OnDemand;
    Device::open(cfg).unwrap()
}

struct Side {
    _dev: Device,
    pd: Pd,
    cq: Cq,
    qp: Qp,
}

fn side(dev: &Device) -> Side {
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64, None).unwrap();
    let qp = pd.create_qp(&QpInitAttr::new(&cq)).unwrap();
    Side {
        _dev: dev.clone(),
        pd,
        cq,
        qp,
    }
}

fn one(cq: &Cq) -> WorkCompletion {
    let v = cq.wait(1, T);
    assert_eq!(v.len(), 1, "no completion within {T:?}");
    v[0]
}

#[test]
fn connect_send_and_disconnect_from_either_side() {
    let port = 26791;
    for server_disconnects in [false, true] {
        let (tx, rx) = mpsc::channel();
        let server = std::thread::spawn(move || {
            let dev = device([127, 0, 0, 2], port);
            let cm = ConnectionManager::open(&dev).unwrap();
            let l = cm.listen(7471).unwrap();
            tx.send(()).unwrap();
            let req = l.get_request(T).unwrap();
            assert_eq!(req.peer(), IpAddr::from([127, 0, 0, 1]));
            assert_eq!(&req.private_data()[..5], b"hello");
            let s = side(&dev);
            let buf = s.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
            let param = ConnParam {
                private_data: b"welcome".to_vec(),
                ..ConnParam::default()
            };
            let conn = req.accept(&s.qp, &param, T).unwrap();
            // (A SEND that comes before the receive meets RNR and is retried.)
            s.qp.post_recv(&RecvWr {
                wr_id: 9,
                sg_list: &[buf.sge(0, 64)],
            })
            .unwrap();
            let wc = one(&s.cq);
            assert_eq!(
                (wc.wr_id, wc.status, wc.byte_len),
                (9, WcStatus::Success, 5)
            );
            let mut got = [0u8; 5];
            buf.read(0, &mut got).unwrap();
            assert_eq!(&got, b"data!");
            if server_disconnects {
                conn.disconnect(T).unwrap();
            } else {
                conn.wait_disconnected(T).unwrap();
            }
            cm.counters()
        });
        rx.recv().unwrap();
        let dev = device([127, 0, 0, 1], port);
        let cm = ConnectionManager::open(&dev).unwrap();
        assert!(
            ConnectionManager::open(&dev).is_err(),
            "one connection manager (QP1) per device"
        );
        let s = side(&dev);
        let param = ConnParam {
            private_data: b"hello".to_vec(),
            ..ConnParam::default()
        };
        let dst = SocketAddr::from(([127, 0, 0, 2], 7471));
        let conn = cm.connect(&s.qp, dst, &param, T).unwrap();
        assert_eq!(&conn.private_data()[..7], b"welcome");
        let data = s.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
        data.write(0, b"data!").unwrap();
        let sge = [data.sge(0, 5)];
        s.qp.post_send(&SendWr::new(1, WrOpcode::Send).sg(&sge))
            .unwrap();
        assert_eq!(one(&s.cq).status, WcStatus::Success);
        if server_disconnects {
            conn.wait_disconnected(T).unwrap();
        } else {
            conn.disconnect(T).unwrap();
        }
        let sc = server.join().unwrap();
        let cc = cm.counters();
        assert_eq!(cc.bad + sc.bad, 0);
        assert!(cc.sent >= 3 && sc.sent >= 1, "{cc:?} {sc:?}");
    }
}

#[test]
fn no_listener_and_consumer_reject() {
    let port = 26792;
    let (tx, rx) = mpsc::channel();
    let server = std::thread::spawn(move || {
        let dev = device([127, 0, 0, 2], port);
        let cm = ConnectionManager::open(&dev).unwrap();
        let l = cm.listen(7000).unwrap();
        tx.send(()).unwrap();
        let req = l.get_request(T).unwrap();
        req.reject(b"go away").unwrap();
        // Stay up until the client has seen the REJ.
        rx_done(&cm);
    });
    fn rx_done(cm: &ConnectionManager) {
        let deadline = std::time::Instant::now() + T;
        while cm.counters().received < 1 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    rx.recv().unwrap();
    let dev = device([127, 0, 0, 1], port);
    let cm = ConnectionManager::open(&dev).unwrap();
    let s = side(&dev);
    let e = cm
        .connect(
            &s.qp,
            SocketAddr::from(([127, 0, 0, 2], 7001)),
            &ConnParam::default(),
            T,
        )
        .unwrap_err();
    assert!(
        matches!(e, CmError::Rejected { reason, .. } if reason == rej_reason::INVALID_SERVICE_ID),
        "{e:?}"
    );
    let s = side(&dev);
    let e = cm
        .connect(
            &s.qp,
            SocketAddr::from(([127, 0, 0, 2], 7000)),
            &ConnParam::default(),
            T,
        )
        .unwrap_err();
    match e {
        CmError::Rejected {
            reason,
            private_data,
        } => {
            assert_eq!(reason, rej_reason::CONSUMER_DEFINED);
            assert_eq!(&private_data[..7], b"go away");
        }
        e => panic!("{e:?}"),
    }
    server.join().unwrap();
}

/// Run a future to completion on this thread (the test's executor: the connection manager's
/// thread wakes it through the waker, which unparks this thread).
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    let end = std::time::Instant::now() + T;
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        assert!(
            std::time::Instant::now() < end,
            "a future not woken within {T:?}"
        );
        // Only a wake-up makes progress: a lost one would end the test here.
        std::thread::park_timeout(T);
    }
}

/// The async API, on an executor that only ever runs a task when its waker fires: request,
/// accept, connect, data, disconnect and the peer's disconnected future all complete; a
/// connect future dropped before the REP leaves no connection behind.
#[test]
fn async_connect_accept_and_disconnect() {
    let port = 26793;
    let (tx, rx) = mpsc::channel();
    let server = std::thread::spawn(move || {
        let dev = device([127, 0, 0, 6], port);
        let cm = ConnectionManager::open(&dev).unwrap();
        let l = cm.listen(7473).unwrap();
        assert!(l.try_get_request().is_none());
        tx.send(()).unwrap();
        block_on(async {
            let req = l.request().await;
            assert_eq!(&req.private_data()[..5], b"async");
            let s = side(&dev);
            let buf = s.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
            let conn = req
                .accept_async(&s.qp, &ConnParam::default())
                .await
                .unwrap();
            // (A SEND that comes before the receive meets RNR and is retried.)
            s.qp.post_recv(&RecvWr {
                wr_id: 1,
                sg_list: &[buf.sge(0, 64)],
            })
            .unwrap();
            let wc = one(&s.cq);
            assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 4));
            conn.disconnected().await;
        });
    });
    rx.recv().unwrap();
    let dev = device([127, 0, 0, 5], port);
    let cm = ConnectionManager::open(&dev).unwrap();
    let s = side(&dev);
    let dst = SocketAddr::new(IpAddr::from([127, 0, 0, 6]), 7473);
    let param = ConnParam {
        private_data: b"async".to_vec(),
        ..ConnParam::default()
    };
    block_on(async {
        let conn = cm.connect_async(&s.qp, dst, &param).await.unwrap();
        let buf = s.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
        buf.write(0, b"ping").unwrap();
        s.qp.post_send(&SendWr::new(2, WrOpcode::Send).sg(&[buf.sge(0, 4)]))
            .unwrap();
        assert_eq!(one(&s.cq).status, WcStatus::Success);
        conn.disconnect_async().await.unwrap();
    });
    server.join().unwrap();
    // A connect future dropped while it waits (nobody answers at this address): the REQ's
    // connection is gone with it.
    let qp = s.pd.create_qp(&QpInitAttr::new(&s.cq)).unwrap();
    let silent = SocketAddr::new(IpAddr::from([127, 0, 0, 7]), 7473);
    let mut f = Box::pin(cm.connect_async(&qp, silent, &param));
    let waker = std::task::Waker::noop();
    assert!(
        f.as_mut()
            .poll(&mut std::task::Context::from_waker(waker))
            .is_pending()
    );
    drop(f);
    let deadline = std::time::Instant::now() + T;
    assert_eq!(
        cm.conn_count(),
        0,
        "the dropped connect left its connection"
    );
    while cm.counters().sent < 1 {
        assert!(std::time::Instant::now() < deadline, "{:?}", cm.counters());
        std::thread::sleep(Duration::from_millis(10));
    }
}
