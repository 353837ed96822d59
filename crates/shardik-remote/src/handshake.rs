//! The handshake: version, cluster name, identities and a shared-secret challenge-response.
//!
//! ```text
//! connector                                   acceptor
//!   Hello {version, cluster, id, nonce_c}  ->
//!                                          <-  Challenge {version, cluster, id, nonce_a, proof_a}
//!   Response {proof_c}                     ->
//!                                          <-  Accept | Reject
//! ```
//!
//! `proof_x = HMAC-SHA256(secret, role_x | cluster | connector id | acceptor id | nonce_c |
//! nonce_a)` with a different role label per side, so a proof can never be reflected back, and
//! both fresh nonces, so it can never be replayed. The secret itself is never sent. Each side
//! checks the other's proof in constant time. Either side refuses with [`Reject`] and a
//! reason, logs it at `error` (`warn` for a duplicate connection) and closes; no user frame is
//! read before [`Accept`].
//!
//! Without a configured secret both sides use an empty key: the exchange then only checks
//! versions and cluster names and authenticates nothing.

use std::time::Duration;

use futures_util::StreamExt;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio_util::codec::FramedRead;

use crate::codec::{encode_frame, BodyCodec};
use crate::error::{FrameError, HandshakeError};
use crate::frame::{Accept, Challenge, Frame, Hello, NodeIdentity, Reject, RejectReason, Response};

const ROLE_CONNECTOR: &[u8] = b"shardik-remote/v1/connector";
const ROLE_ACCEPTOR: &[u8] = b"shardik-remote/v1/acceptor";

/// What a node brings to a handshake.
#[derive(Clone)]
pub(crate) struct Local {
    pub version: u32,
    pub cluster: String,
    pub me: NodeIdentity,
    pub secret: std::sync::Arc<[u8]>,
    pub timeout: Duration,
    pub max_frame_len: usize,
}

impl Local {
    #[cfg(test)]
    pub(crate) fn for_test(node: &str, cluster: &str, secret: &[u8]) -> Self {
        Local {
            version: crate::frame::PROTOCOL_VERSION,
            cluster: cluster.into(),
            me: NodeIdentity {
                node_id: node.into(),
                incarnation: 1,
                addr: format!("{node}:1"),
            },
            secret: secret.into(),
            timeout: Duration::from_secs(5),
            max_frame_len: crate::codec::DEFAULT_MAX_FRAME_LEN,
        }
    }
}

type HmacSha256 = Hmac<Sha256>;

fn mac(
    secret: &[u8],
    role: &[u8],
    cluster: &str,
    connector: &NodeIdentity,
    acceptor: &NodeIdentity,
    nonce_c: &[u8; 32],
    nonce_a: &[u8; 32],
) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(secret).expect("HMAC accepts keys of any length");
    let mut field = |b: &[u8]| {
        m.update(&(b.len() as u64).to_be_bytes());
        m.update(b);
    };
    field(role);
    field(cluster.as_bytes());
    for id in [connector, acceptor] {
        field(id.node_id.as_bytes());
        field(&id.incarnation.to_be_bytes());
        field(id.addr.as_bytes());
    }
    field(nonce_c);
    field(nonce_a);
    m
}

/// Computes the proof of one side.
pub(crate) fn proof(
    secret: &[u8],
    acceptor_role: bool,
    cluster: &str,
    connector: &NodeIdentity,
    acceptor: &NodeIdentity,
    nonce_c: &[u8; 32],
    nonce_a: &[u8; 32],
) -> [u8; 32] {
    let role = if acceptor_role {
        ROLE_ACCEPTOR
    } else {
        ROLE_CONNECTOR
    };
    mac(secret, role, cluster, connector, acceptor, nonce_c, nonce_a)
        .finalize()
        .into_bytes()
        .into()
}

/// Checks a proof in constant time.
#[allow(clippy::too_many_arguments)]
fn verify(
    secret: &[u8],
    acceptor_role: bool,
    cluster: &str,
    connector: &NodeIdentity,
    acceptor: &NodeIdentity,
    nonce_c: &[u8; 32],
    nonce_a: &[u8; 32],
    given: &[u8; 32],
) -> bool {
    let role = if acceptor_role {
        ROLE_ACCEPTOR
    } else {
        ROLE_CONNECTOR
    };
    mac(secret, role, cluster, connector, acceptor, nonce_c, nonce_a)
        .verify_slice(given)
        .is_ok()
}

pub(crate) fn nonce() -> [u8; 32] {
    let mut n = [0u8; 32];
    getrandom::fill(&mut n).expect("the operating system's random source is available");
    n
}

async fn send<W: AsyncWrite + Unpin>(
    w: &mut W,
    frame: &Frame,
    max: usize,
) -> Result<(), FrameError> {
    let mut buf = bytes::BytesMut::with_capacity(256);
    encode_frame(frame, &mut buf, max)?;
    w.write_all(&buf).await?;
    w.flush().await?;
    Ok(())
}

async fn recv<R: AsyncRead + Unpin>(
    r: &mut FramedRead<R, BodyCodec>,
) -> Result<Frame, HandshakeError> {
    match r.next().await {
        Some(Ok(body)) => Ok(Frame::decode_body(body)?),
        Some(Err(e)) => Err(e.into()),
        None => Err(HandshakeError::Closed),
    }
}

/// What both sides must share before any secret is involved: the protocol version and the
/// cluster name. `Err` carries the reason and the detail to send back and log.
fn compatible(local: &Local, version: u32, cluster: &str) -> Result<(), (RejectReason, String)> {
    if version != local.version {
        let detail = format!("peer speaks version {version}, we speak {}", local.version);
        return Err((RejectReason::Version, detail));
    }
    if cluster != local.cluster {
        let detail = format!(
            "peer is in cluster {cluster:?}, we are in {:?}",
            local.cluster
        );
        return Err((RejectReason::Cluster, detail));
    }
    Ok(())
}

async fn refuse<W: AsyncWrite + Unpin>(
    w: &mut W,
    local: &Local,
    reason: RejectReason,
    detail: String,
) -> HandshakeError {
    let frame = Frame::Reject(Reject {
        reason,
        detail: detail.clone(),
    });
    // Best effort: the peer may already be gone.
    let _ = send(w, &frame, local.max_frame_len).await;
    let _ = w.shutdown().await;
    HandshakeError::Refused { reason, detail }
}

/// Runs the connecting side. Returns the acceptor's identity.
pub(crate) async fn connect<R, W>(
    r: &mut FramedRead<R, BodyCodec>,
    w: &mut W,
    local: &Local,
) -> Result<NodeIdentity, HandshakeError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    match tokio::time::timeout(local.timeout, connect_inner(r, w, local)).await {
        Ok(res) => res,
        Err(_) => Err(HandshakeError::Timeout),
    }
}

async fn connect_inner<R, W>(
    r: &mut FramedRead<R, BodyCodec>,
    w: &mut W,
    local: &Local,
) -> Result<NodeIdentity, HandshakeError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let nonce_c = nonce();
    let hello = Frame::Hello(Hello {
        version: local.version,
        cluster: local.cluster.clone(),
        from: local.me.clone(),
        nonce: nonce_c,
    });
    send(w, &hello, local.max_frame_len).await?;
    let ch = match recv(r).await? {
        Frame::Challenge(c) => c,
        Frame::Reject(rj) => {
            return Err(HandshakeError::RefusedByPeer {
                reason: rj.reason,
                detail: rj.detail,
            })
        }
        other => {
            let detail = format!("expected a challenge, got {}", kind_name(&other));
            return Err(refuse(w, local, RejectReason::Protocol, detail).await);
        }
    };
    if let Err((reason, detail)) = compatible(local, ch.version, &ch.cluster) {
        return Err(refuse(w, local, reason, detail).await);
    }
    if !verify(
        &local.secret,
        true,
        &local.cluster,
        &local.me,
        &ch.from,
        &nonce_c,
        &ch.nonce,
        &ch.proof,
    ) {
        let detail = format!(
            "{} ({}) did not prove knowledge of the shared secret",
            ch.from.node_id, ch.from.addr
        );
        return Err(refuse(w, local, RejectReason::Authentication, detail).await);
    }
    let my_proof = proof(
        &local.secret,
        false,
        &local.cluster,
        &local.me,
        &ch.from,
        &nonce_c,
        &ch.nonce,
    );
    send(
        w,
        &Frame::Response(Response { proof: my_proof }),
        local.max_frame_len,
    )
    .await?;
    match recv(r).await? {
        Frame::Accept(Accept {}) => Ok(ch.from),
        Frame::Reject(rj) => Err(HandshakeError::RefusedByPeer {
            reason: rj.reason,
            detail: rj.detail,
        }),
        other => {
            let detail = format!("expected accept, got {}", kind_name(&other));
            Err(refuse(w, local, RejectReason::Protocol, detail).await)
        }
    }
}

/// Runs the accepting side. `admit` is asked, after the peer has proven itself and before
/// [`Accept`] is sent, whether this connection may be kept (simultaneous connects); it must
/// install the connection if it says yes.
pub(crate) async fn accept<R, W>(
    r: &mut FramedRead<R, BodyCodec>,
    w: &mut W,
    local: &Local,
    admit: impl FnOnce(&NodeIdentity) -> Result<(), RejectReason>,
) -> Result<NodeIdentity, HandshakeError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    match tokio::time::timeout(local.timeout, accept_inner(r, w, local, admit)).await {
        Ok(res) => res,
        Err(_) => Err(HandshakeError::Timeout),
    }
}

async fn accept_inner<R, W>(
    r: &mut FramedRead<R, BodyCodec>,
    w: &mut W,
    local: &Local,
    admit: impl FnOnce(&NodeIdentity) -> Result<(), RejectReason>,
) -> Result<NodeIdentity, HandshakeError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let hello = match recv(r).await? {
        Frame::Hello(h) => h,
        other => {
            let detail = format!("expected hello, got {}", kind_name(&other));
            return Err(refuse(w, local, RejectReason::Protocol, detail).await);
        }
    };
    if let Err((reason, detail)) = compatible(local, hello.version, &hello.cluster) {
        return Err(refuse(w, local, reason, detail).await);
    }
    let nonce_a = nonce();
    let my_proof = proof(
        &local.secret,
        true,
        &local.cluster,
        &hello.from,
        &local.me,
        &hello.nonce,
        &nonce_a,
    );
    let challenge = Frame::Challenge(Challenge {
        version: local.version,
        cluster: local.cluster.clone(),
        from: local.me.clone(),
        nonce: nonce_a,
        proof: my_proof,
    });
    send(w, &challenge, local.max_frame_len).await?;
    let resp = match recv(r).await? {
        Frame::Response(resp) => resp,
        Frame::Reject(rj) => {
            return Err(HandshakeError::RefusedByPeer {
                reason: rj.reason,
                detail: rj.detail,
            })
        }
        other => {
            let detail = format!("expected a response, got {}", kind_name(&other));
            return Err(refuse(w, local, RejectReason::Protocol, detail).await);
        }
    };
    if !verify(
        &local.secret,
        false,
        &local.cluster,
        &hello.from,
        &local.me,
        &hello.nonce,
        &nonce_a,
        &resp.proof,
    ) {
        let detail = format!(
            "{} ({}) did not prove knowledge of the shared secret",
            hello.from.node_id, hello.from.addr
        );
        return Err(refuse(w, local, RejectReason::Authentication, detail).await);
    }
    if let Err(reason) = admit(&hello.from) {
        let detail = format!("not admitting {} ({})", hello.from.node_id, hello.from.addr);
        return Err(refuse(w, local, reason, detail).await);
    }
    send(w, &Frame::Accept(Accept {}), local.max_frame_len).await?;
    Ok(hello.from)
}

fn kind_name(f: &Frame) -> &'static str {
    match f {
        Frame::Hello(_) => "hello",
        Frame::Challenge(_) => "challenge",
        Frame::Response(_) => "response",
        Frame::Accept(_) => "accept",
        Frame::Reject(_) => "reject",
        Frame::Heartbeat(_) => "heartbeat",
        Frame::HeartbeatAck(_) => "heartbeat ack",
        Frame::Message(_) => "message",
        Frame::Reply { .. } => "reply",
        Frame::ReplyFailed { .. } => "reply failed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn run(
        c: Local,
        a: Local,
    ) -> (
        Result<NodeIdentity, HandshakeError>,
        Result<NodeIdentity, HandshakeError>,
    ) {
        let (cs, as_) = tokio::io::duplex(4096);
        let (cr, mut cw) = tokio::io::split(cs);
        let (ar, mut aw) = tokio::io::split(as_);
        let mut cr = FramedRead::new(cr, BodyCodec::default());
        let mut ar = FramedRead::new(ar, BodyCodec::default());
        tokio::join!(
            connect(&mut cr, &mut cw, &c),
            accept(&mut ar, &mut aw, &a, |_| Ok(()))
        )
    }

    #[tokio::test]
    async fn same_secret_and_cluster_connect() {
        let (c, a) = run(
            Local::for_test("c", "k", b"s"),
            Local::for_test("a", "k", b"s"),
        )
        .await;
        assert_eq!(c.unwrap().node_id, "a");
        assert_eq!(a.unwrap().node_id, "c");
    }

    #[tokio::test]
    async fn wrong_secret_is_refused_on_both_sides() {
        let (c, a) = run(
            Local::for_test("c", "k", b"s1"),
            Local::for_test("a", "k", b"s2"),
        )
        .await;
        // The connector checks the acceptor's proof first and refuses it.
        assert_eq!(c.unwrap_err().reason(), Some(RejectReason::Authentication));
        assert_eq!(a.unwrap_err().reason(), Some(RejectReason::Authentication));
    }

    #[tokio::test]
    async fn wrong_cluster_and_version_are_refused() {
        let (c, a) = run(
            Local::for_test("c", "k1", b"s"),
            Local::for_test("a", "k2", b"s"),
        )
        .await;
        assert_eq!(c.unwrap_err().reason(), Some(RejectReason::Cluster));
        assert_eq!(a.unwrap_err().reason(), Some(RejectReason::Cluster));
        let mut old = Local::for_test("c", "k", b"s");
        old.version = 0;
        let (c, a) = run(old, Local::for_test("a", "k", b"s")).await;
        assert_eq!(c.unwrap_err().reason(), Some(RejectReason::Version));
        assert_eq!(a.unwrap_err().reason(), Some(RejectReason::Version));
    }

    #[tokio::test]
    async fn admission_can_refuse_a_duplicate() {
        let (cs, as_) = tokio::io::duplex(4096);
        let (cr, mut cw) = tokio::io::split(cs);
        let (ar, mut aw) = tokio::io::split(as_);
        let mut cr = FramedRead::new(cr, BodyCodec::default());
        let mut ar = FramedRead::new(ar, BodyCodec::default());
        let c = Local::for_test("c", "k", b"s");
        let a = Local::for_test("a", "k", b"s");
        let (c, a) = tokio::join!(
            connect(&mut cr, &mut cw, &c),
            accept(&mut ar, &mut aw, &a, |_| Err(RejectReason::Duplicate))
        );
        assert_eq!(c.unwrap_err().reason(), Some(RejectReason::Duplicate));
        assert_eq!(a.unwrap_err().reason(), Some(RejectReason::Duplicate));
    }

    #[test]
    fn proofs_depend_on_role_secret_and_nonces() {
        let c = Local::for_test("c", "k", b"s").me;
        let a = Local::for_test("a", "k", b"s").me;
        let p = proof(b"s", true, "k", &c, &a, &[1; 32], &[2; 32]);
        assert_ne!(p, proof(b"s", false, "k", &c, &a, &[1; 32], &[2; 32]));
        assert_ne!(p, proof(b"t", true, "k", &c, &a, &[1; 32], &[2; 32]));
        assert_ne!(p, proof(b"s", true, "k", &c, &a, &[1; 32], &[3; 32]));
        assert!(verify(b"s", true, "k", &c, &a, &[1; 32], &[2; 32], &p));
    }

    #[tokio::test]
    async fn a_silent_peer_times_out() {
        let (cs, _keep) = tokio::io::duplex(4096);
        let (cr, mut cw) = tokio::io::split(cs);
        let mut cr = FramedRead::new(cr, BodyCodec::default());
        let mut c = Local::for_test("c", "k", b"s");
        c.timeout = Duration::from_millis(50);
        assert!(matches!(
            connect(&mut cr, &mut cw, &c).await,
            Err(HandshakeError::Timeout)
        ));
    }
}
