//! The handshake: version, cluster name, identities and a shared-secret challenge-response.
//!
//! ```text
//! connector                                          acceptor
//!   Hello {version, cluster, id, nonce_c, lane, format} ->
//!                                  <-  Challenge {version, cluster, id, nonce_a, proof_a, format}
//!   Response {proof_c}                                  ->
//!                                                   <-  Accept | Reject
//! ```
//!
//! `proof_x = HMAC-SHA256(secret, role_x | cluster | lane | connector id | acceptor id |
//! nonce_c | nonce_a)` with a different role label per side, so a proof cannot be reflected
//! back to another node, and both fresh nonces, so it can never be replayed. With one node on
//! both ends the two roles' transcripts are the same node's, so each side refuses a peer with
//! its own identity before anything is proven (a relay could otherwise pass a node's own
//! handshake back to it). Both connections of a node pair (the control and the user [`Lane`])
//! run the same handshake; the lane is part of the proofs. Nodes whose payload formats differ
//! refuse each other like nodes of different clusters. The secret itself is never sent. Each
//! side checks the other's proof in constant time. Either side refuses with [`Reject`] and a
//! reason and closes (the node logs it, rate-limited per kind of failure, and publishes it as
//! an event); no user frame is read before [`Accept`].
//!
//! Without a configured secret both sides use an empty key: the exchange then only checks
//! versions and cluster names and authenticates nothing.

use futures_util::StreamExt;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio_util::codec::FramedRead;

use crate::codec::{encode_frame, BodyCodec};
use crate::error::{FrameError, HandshakeError};
use crate::frame::{
    Accept, Challenge, Frame, Hello, Lane, NodeIdentity, Reject, RejectReason, Response,
};
use crate::node::{clip, shown, shown_max};
use crate::remote_ref::check_node_addr;

const ROLE_CONNECTOR: &[u8] = b"shardik-remote/v1/connector";
const ROLE_ACCEPTOR: &[u8] = b"shardik-remote/v1/acceptor";

/// What a node brings to a handshake.
#[derive(Clone)]
pub(crate) struct Local {
    pub version: u32,
    pub cluster: String,
    pub me: NodeIdentity,
    pub secret: std::sync::Arc<[u8]>,
    pub max_frame_len: usize,
    /// Name of this node's payload format.
    pub payload_format: String,
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
            max_frame_len: crate::codec::DEFAULT_MAX_FRAME_LEN,
            payload_format: "msgpack-named".into(),
        }
    }
}

type HmacSha256 = Hmac<Sha256>;

/// What a proof covers besides the secret and the role.
#[derive(Clone, Copy)]
pub(crate) struct Transcript<'a> {
    pub cluster: &'a str,
    pub lane: Lane,
    pub connector: &'a NodeIdentity,
    pub acceptor: &'a NodeIdentity,
    pub nonce_c: &'a [u8; 32],
    pub nonce_a: &'a [u8; 32],
}

fn mac(secret: &[u8], role: &[u8], t: Transcript<'_>) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(secret).expect("HMAC accepts keys of any length");
    let mut field = |b: &[u8]| {
        m.update(&(b.len() as u64).to_be_bytes());
        m.update(b);
    };
    field(role);
    field(t.cluster.as_bytes());
    field(t.lane.as_str().as_bytes());
    for id in [t.connector, t.acceptor] {
        field(id.node_id.as_bytes());
        field(&id.incarnation.to_be_bytes());
        field(id.addr.as_bytes());
    }
    field(t.nonce_c);
    field(t.nonce_a);
    m
}

fn role(acceptor_role: bool) -> &'static [u8] {
    if acceptor_role {
        ROLE_ACCEPTOR
    } else {
        ROLE_CONNECTOR
    }
}

/// Computes the proof of one side.
pub(crate) fn proof(secret: &[u8], acceptor_role: bool, t: Transcript<'_>) -> [u8; 32] {
    mac(secret, role(acceptor_role), t)
        .finalize()
        .into_bytes()
        .into()
}

/// Checks a proof in constant time.
fn verify(secret: &[u8], acceptor_role: bool, t: Transcript<'_>, given: &[u8; 32]) -> bool {
    mac(secret, role(acceptor_role), t)
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

/// What both sides must share before any secret is involved: the protocol version, the
/// cluster name and the payload format. `Err` carries the reason and the detail to send back
/// and log.
fn compatible(
    local: &Local,
    version: u32,
    cluster: &str,
    payload_format: &str,
) -> Result<(), (RejectReason, String)> {
    if version != local.version {
        let detail = format!("peer speaks version {version}, we speak {}", local.version);
        return Err((RejectReason::Version, detail));
    }
    if cluster != local.cluster {
        let detail = format!(
            "peer is in cluster {:?}, we are in {:?}",
            clip(cluster),
            local.cluster
        );
        return Err((RejectReason::Cluster, detail));
    }
    if payload_format != local.payload_format {
        let detail = format!(
            "peer encodes payloads as {:?}, we encode them as {:?}; \
             every node must use the same RemoteConfig::payload_format",
            clip(payload_format),
            local.payload_format
        );
        return Err((RejectReason::PayloadFormat, detail));
    }
    Ok(())
}

/// The longest node id a node may have (checked at start) or a peer may claim.
pub(crate) const MAX_NODE_ID: usize = 255;

/// Checks a node id: 1 to [`MAX_NODE_ID`] bytes, no control characters. The error quotes
/// its start, escaped.
pub(crate) fn check_node_id(node_id: &str) -> Result<(), String> {
    if node_id.is_empty() || node_id.len() > MAX_NODE_ID || node_id.chars().any(char::is_control) {
        return Err(format!(
            "a node id must be 1 to {MAX_NODE_ID} bytes without control characters, got {} \
             bytes: {}",
            node_id.len(),
            shown_max(node_id, 64)
        ));
    }
    Ok(())
}

/// Why the identity a peer claims is refused, if it is not one a node can have (see
/// [`check_node_id`] and [`check_node_addr`]): its address becomes the key of the peer's
/// state here, and both go into log lines and events.
fn odd_identity(id: &NodeIdentity) -> Option<String> {
    check_node_id(&id.node_id)
        .and_then(|()| check_node_addr(&id.addr))
        .err()
        .map(|e| format!("the peer's identity is not one a node can have: {e}"))
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

/// Why a [`RejectReason::Duplicate`] before the other side proved itself is refused. Only
/// the acceptor decides duplicates, once both sides are proven: a duplicate refusal is not
/// counted as a failed handshake, so one that nothing authenticates would let anyone who
/// can answer a dial hide failures (and keep the dialer from giving up its frames).
fn early_duplicate() -> String {
    "the peer refused the connection as a duplicate before proving itself".into()
}

/// Runs the connecting side for a connection on `lane`. Returns the acceptor's identity.
pub(crate) async fn connect<R, W>(
    r: &mut FramedRead<R, BodyCodec>,
    w: &mut W,
    local: &Local,
    lane: Lane,
    deadline: tokio::time::Instant,
) -> Result<NodeIdentity, HandshakeError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    match tokio::time::timeout_at(deadline, connect_inner(r, w, local, lane)).await {
        Ok(res) => res,
        Err(_) => Err(HandshakeError::Timeout),
    }
}

async fn connect_inner<R, W>(
    r: &mut FramedRead<R, BodyCodec>,
    w: &mut W,
    local: &Local,
    lane: Lane,
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
        lane,
        payload_format: local.payload_format.clone(),
    });
    send(w, &hello, local.max_frame_len).await?;
    let ch = match recv(r).await? {
        Frame::Challenge(c) => c,
        Frame::Reject(rj) if rj.reason == RejectReason::Duplicate => {
            return Err(refuse(w, local, RejectReason::Protocol, early_duplicate()).await);
        }
        Frame::Reject(rj) => {
            return Err(HandshakeError::RefusedByPeer {
                reason: rj.reason,
                detail: shown(&rj.detail),
            })
        }
        other => {
            let detail = format!("expected a challenge, got {}", kind_name(&other));
            return Err(refuse(w, local, RejectReason::Protocol, detail).await);
        }
    };
    if let Err((reason, detail)) = compatible(local, ch.version, &ch.cluster, &ch.payload_format) {
        return Err(refuse(w, local, reason, detail).await);
    }
    if let Some(detail) = odd_identity(&ch.from) {
        return Err(refuse(w, local, RejectReason::Protocol, detail).await);
    }
    if let Some(detail) = is_myself(local, &ch.from) {
        return Err(refuse(w, local, RejectReason::Protocol, detail).await);
    }
    let transcript = Transcript {
        cluster: &local.cluster,
        lane,
        connector: &local.me,
        acceptor: &ch.from,
        nonce_c: &nonce_c,
        nonce_a: &ch.nonce,
    };
    if !verify(&local.secret, true, transcript, &ch.proof) {
        let detail = format!(
            "{} ({}) did not prove knowledge of the shared secret",
            shown(&ch.from.node_id),
            shown(&ch.from.addr)
        );
        return Err(refuse(w, local, RejectReason::Authentication, detail).await);
    }
    if let Some(detail) = claims_my_address(local, &ch.from) {
        return Err(refuse(w, local, RejectReason::Protocol, detail).await);
    }
    let my_proof = proof(&local.secret, false, transcript);
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
            detail: shown(&rj.detail),
        }),
        other => {
            let detail = format!("expected accept, got {}", kind_name(&other));
            Err(refuse(w, local, RejectReason::Protocol, detail).await)
        }
    }
}

/// Runs the accepting side. `admit` is asked, after the peer has proven itself and before
/// [`Accept`] is sent, whether this connection (on the lane the peer named) may be kept
/// (simultaneous connects); it must install the connection if it says yes. Returns the
/// connector's identity and the lane.
pub(crate) async fn accept<R, W>(
    r: &mut FramedRead<R, BodyCodec>,
    w: &mut W,
    local: &Local,
    deadline: tokio::time::Instant,
    admit: impl FnOnce(&NodeIdentity, Lane) -> Result<(), RejectReason>,
) -> Result<(NodeIdentity, Lane), HandshakeError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    match tokio::time::timeout_at(deadline, accept_inner(r, w, local, admit)).await {
        Ok(res) => res,
        Err(_) => Err(HandshakeError::Timeout),
    }
}

async fn accept_inner<R, W>(
    r: &mut FramedRead<R, BodyCodec>,
    w: &mut W,
    local: &Local,
    admit: impl FnOnce(&NodeIdentity, Lane) -> Result<(), RejectReason>,
) -> Result<(NodeIdentity, Lane), HandshakeError>
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
    if let Err((reason, detail)) =
        compatible(local, hello.version, &hello.cluster, &hello.payload_format)
    {
        return Err(refuse(w, local, reason, detail).await);
    }
    if let Some(detail) = odd_identity(&hello.from) {
        return Err(refuse(w, local, RejectReason::Protocol, detail).await);
    }
    // Before anything is proven for this transcript: with this node on both ends, a relay
    // could pass the two halves of one handshake to each other.
    if let Some(detail) = is_myself(local, &hello.from) {
        return Err(refuse(w, local, RejectReason::Protocol, detail).await);
    }
    let nonce_a = nonce();
    let transcript = Transcript {
        cluster: &local.cluster,
        lane: hello.lane,
        connector: &hello.from,
        acceptor: &local.me,
        nonce_c: &hello.nonce,
        nonce_a: &nonce_a,
    };
    let my_proof = proof(&local.secret, true, transcript);
    let challenge = Frame::Challenge(Challenge {
        version: local.version,
        cluster: local.cluster.clone(),
        from: local.me.clone(),
        nonce: nonce_a,
        proof: my_proof,
        payload_format: local.payload_format.clone(),
    });
    send(w, &challenge, local.max_frame_len).await?;
    let resp = match recv(r).await? {
        Frame::Response(resp) => resp,
        Frame::Reject(rj) if rj.reason == RejectReason::Duplicate => {
            return Err(refuse(w, local, RejectReason::Protocol, early_duplicate()).await);
        }
        Frame::Reject(rj) => {
            return Err(HandshakeError::RefusedByPeer {
                reason: rj.reason,
                detail: shown(&rj.detail),
            })
        }
        other => {
            let detail = format!("expected a response, got {}", kind_name(&other));
            return Err(refuse(w, local, RejectReason::Protocol, detail).await);
        }
    };
    if !verify(&local.secret, false, transcript, &resp.proof) {
        let detail = format!(
            "{} ({}) did not prove knowledge of the shared secret",
            shown(&hello.from.node_id),
            shown(&hello.from.addr)
        );
        return Err(refuse(w, local, RejectReason::Authentication, detail).await);
    }
    if let Some(detail) = claims_my_address(local, &hello.from) {
        return Err(refuse(w, local, RejectReason::Protocol, detail).await);
    }
    if let Err(reason) = admit(&hello.from, hello.lane) {
        let detail = format!(
            "not admitting {} ({})",
            shown(&hello.from.node_id),
            shown(&hello.from.addr)
        );
        return Err(refuse(w, local, reason, detail).await);
    }
    send(w, &Frame::Accept(Accept {}), local.max_frame_len).await?;
    Ok((hello.from, hello.lane))
}

/// Why `peer` is refused if it is another node that advertises this node's own address.
/// Messages for it would be handled here as if they were for this node (its answers never
/// leave), and a third node could not tell the two apart: a misconfigured `advertise`.
fn claims_my_address(local: &Local, peer: &NodeIdentity) -> Option<String> {
    (peer.addr == local.me.addr && *peer != local.me).then(|| {
        format!(
            "{} advertises {}, which is this node's ({}) own address: give every node its \
             own `advertise` address",
            shown(&peer.node_id),
            shown(&peer.addr),
            local.me.node_id
        )
    })
}

/// Why `peer` is refused if it is this very node. A node reaches itself without the network
/// (messages to its own address are handled locally), so a handshake with its own identity
/// on the other end is either a dial that reached this node's own listener under another
/// address (a misconfigured seed or peer address) or someone passing this node's own
/// handshake frames back to it: with the same node on both ends, each side's proof is
/// exactly what the other side checks, so such a relay needs no secret to be accepted.
fn is_myself(local: &Local, peer: &NodeIdentity) -> Option<String> {
    (*peer == local.me).then(|| {
        format!(
            "the other end is this node itself ({} at {}): a dial that reached this node's own \
             listener (list this node under its advertised address, or not at all), or a \
             replay of its own handshake",
            local.me.node_id, local.me.addr
        )
    })
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

    use std::time::Duration;

    type Reader = FramedRead<tokio::io::ReadHalf<tokio::io::DuplexStream>, BodyCodec>;
    type Writer = tokio::io::WriteHalf<tokio::io::DuplexStream>;

    /// Both ends of an in-memory connection: the dialer's reader and writer, then the
    /// acceptor's.
    fn wire() -> (Reader, Writer, Reader, Writer) {
        let (cs, as_) = tokio::io::duplex(4096);
        let (cr, cw) = tokio::io::split(cs);
        let (ar, aw) = tokio::io::split(as_);
        let framed = |r| FramedRead::new(r, BodyCodec::default());
        (framed(cr), cw, framed(ar), aw)
    }

    fn soon() -> tokio::time::Instant {
        tokio::time::Instant::now() + Duration::from_secs(5)
    }

    async fn run(
        c: Local,
        a: Local,
    ) -> (
        Result<NodeIdentity, HandshakeError>,
        Result<(NodeIdentity, Lane), HandshakeError>,
    ) {
        let (mut cr, mut cw, mut ar, mut aw) = wire();
        tokio::join!(
            connect(&mut cr, &mut cw, &c, Lane::User, soon()),
            accept(&mut ar, &mut aw, &a, soon(), |_, _| Ok(()))
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
        let (a, lane) = a.unwrap();
        assert_eq!((a.node_id.as_str(), lane), ("c", Lane::User));
    }

    #[tokio::test]
    async fn different_payload_formats_are_refused_on_both_sides() {
        let mut json = Local::for_test("c", "k", b"s");
        json.payload_format = "json".into();
        let (c, a) = run(json, Local::for_test("a", "k", b"s")).await;
        let c = c.unwrap_err();
        assert_eq!(c.reason(), Some(RejectReason::PayloadFormat));
        assert!(c.to_string().contains("\"json\""), "{c}");
        assert_eq!(a.unwrap_err().reason(), Some(RejectReason::PayloadFormat));
    }

    /// A version 1 node's hello (four fields: no lane, no payload format) decodes, and its
    /// sender is refused for its version with a reject frame, not for a malformed frame.
    #[tokio::test]
    async fn a_version_1_hello_is_refused_for_its_version() {
        let old = (
            1u32,
            "k".to_string(),
            NodeIdentity {
                node_id: "old".into(),
                incarnation: 7,
                addr: "old:1".into(),
            },
            [9u8; 32],
        );
        let mut body = vec![1u8]; // the hello frame kind, unchanged since version 1
        body.extend(rmp_serde::to_vec(&old).unwrap());
        let mut framed = (body.len() as u32).to_be_bytes().to_vec();
        framed.extend(body);
        let (cs, as_) = tokio::io::duplex(4096);
        let (mut cr, mut cw) = tokio::io::split(cs);
        let (ar, mut aw) = tokio::io::split(as_);
        let mut ar = FramedRead::new(ar, BodyCodec::default());
        tokio::io::AsyncWriteExt::write_all(&mut cw, &framed)
            .await
            .unwrap();
        let a = Local::for_test("a", "k", b"s");
        let err = accept(&mut ar, &mut aw, &a, soon(), |_, _| Ok(()))
            .await
            .unwrap_err();
        assert_eq!(err.reason(), Some(RejectReason::Version), "{err}");
        assert!(err.to_string().contains("version 1"), "{err}");
        // The old node is told why, in a reject frame.
        let mut cr = FramedRead::new(&mut cr, BodyCodec::default());
        let reject = cr.next().await.unwrap().unwrap();
        assert!(matches!(
            Frame::decode_body(reject).unwrap(),
            Frame::Reject(r) if r.reason == RejectReason::Version
        ));
    }

    /// A node that advertises the other's address is refused whichever side dials.
    #[tokio::test]
    async fn a_peer_claiming_my_address_is_refused_by_either_side() {
        let mut impostor = Local::for_test("c", "k", b"s");
        impostor.me.addr = "a:1".into();
        // The impostor dials: the acceptor refuses its hello.
        let (c, a) = run(impostor.clone(), Local::for_test("a", "k", b"s")).await;
        let a = a.unwrap_err();
        assert_eq!(a.reason(), Some(RejectReason::Protocol));
        assert!(a.to_string().contains("own address"), "{a}");
        assert_eq!(c.unwrap_err().reason(), Some(RejectReason::Protocol));
        // The impostor accepts: the connector refuses its challenge.
        let (a, c) = run(Local::for_test("a", "k", b"s"), impostor).await;
        let a = a.unwrap_err();
        assert_eq!(a.reason(), Some(RejectReason::Protocol));
        assert!(a.to_string().contains("own address"), "{a}");
        assert_eq!(c.unwrap_err().reason(), Some(RejectReason::Protocol));
    }

    /// A node's own handshake passed back to it (a relay between its dialing and its
    /// accepting side, which knows no secret, or a dial that reached its own listener) is
    /// refused by both sides: with one identity on both ends each side's proof would be the
    /// one the other checks.
    #[tokio::test]
    async fn a_node_is_refused_by_itself() {
        let me = Local::for_test("a", "k", b"s");
        let (c, a) = run(me.clone(), me.clone()).await;
        let a = a.unwrap_err();
        assert_eq!(a.reason(), Some(RejectReason::Protocol));
        assert!(a.to_string().contains("this node itself"), "{a}");
        assert_eq!(c.unwrap_err().reason(), Some(RejectReason::Protocol));
        // The dialing side refuses on its own too: an acceptor that answers with this node's
        // identity and the very proof this node's accepting side would give.
        let (mut cr, mut cw, mut ar, mut aw) = wire();
        let reflect = async {
            let body = ar.next().await.unwrap().unwrap();
            let Frame::Hello(hello) = Frame::decode_body(body).unwrap() else {
                panic!("the dialer opens with a hello")
            };
            let nonce_a = nonce();
            let transcript = Transcript {
                cluster: &me.cluster,
                lane: hello.lane,
                connector: &hello.from,
                acceptor: &me.me,
                nonce_c: &hello.nonce,
                nonce_a: &nonce_a,
            };
            let challenge = Frame::Challenge(Challenge {
                version: me.version,
                cluster: me.cluster.clone(),
                from: me.me.clone(),
                nonce: nonce_a,
                proof: proof(&me.secret, true, transcript),
                payload_format: me.payload_format.clone(),
            });
            send(&mut aw, &challenge, me.max_frame_len).await.unwrap();
            Frame::decode_body(ar.next().await.unwrap().unwrap()).unwrap()
        };
        let (c, answer) = tokio::join!(connect(&mut cr, &mut cw, &me, Lane::User, soon()), reflect);
        assert_eq!(c.unwrap_err().reason(), Some(RejectReason::Protocol));
        assert!(
            matches!(answer, Frame::Reject(ref r) if r.reason == RejectReason::Protocol),
            "refused instead of answering with its own proof: {answer:?}"
        );
    }

    /// A peer's identity must be one a node can have: a node id of at most 255 bytes
    /// without control characters, an address `host:port` of at most 300 bytes without
    /// spaces or control characters. Either side refuses another with a protocol violation
    /// whose detail quotes it escaped and cut. (Before, any strings were taken: the address
    /// became the key of the peer's state, and both were logged raw, 60 KB of terminal
    /// escapes included.)
    #[tokio::test]
    async fn an_identity_no_node_can_have_is_refused_by_either_side() {
        let evil = format!("evil\n\u{1b}[31m{}", "x".repeat(60_000));
        for (node_id, addr) in [
            (evil.clone(), "c:1".to_string()),
            ("c".repeat(256), "c:1".to_string()),
            ("c".to_string(), evil.clone()),
            ("c".to_string(), "no-port".to_string()),
            ("c".to_string(), "c:1\n".to_string()),
        ] {
            let mut odd = Local::for_test("c", "k", b"s");
            odd.me.node_id = node_id;
            odd.me.addr = addr;
            let check = |e: HandshakeError| {
                assert_eq!(e.reason(), Some(RejectReason::Protocol), "{e}");
                let text = e.to_string();
                assert!(text.contains("identity"), "{text:.300}");
                assert!(!text.contains(['\n', '\u{1b}']), "{text:.300}");
                assert!(text.len() < 800, "{} bytes: {text:.300}", text.len());
            };
            // It dials: the acceptor refuses its hello.
            let (c, a) = run(odd.clone(), Local::for_test("a", "k", b"s")).await;
            check(a.unwrap_err());
            assert!(c.is_err());
            // It accepts: the dialer refuses its challenge.
            let (c, a) = run(Local::for_test("a", "k", b"s"), odd).await;
            check(c.unwrap_err());
            assert!(a.is_err());
        }
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
        let (mut cr, mut cw, mut ar, mut aw) = wire();
        let c = Local::for_test("c", "k", b"s");
        let a = Local::for_test("a", "k", b"s");
        let (c, a) = tokio::join!(
            connect(&mut cr, &mut cw, &c, Lane::Control, soon()),
            accept(&mut ar, &mut aw, &a, soon(), |_, _| Err(
                RejectReason::Duplicate
            ))
        );
        assert_eq!(c.unwrap_err().reason(), Some(RejectReason::Duplicate));
        assert_eq!(a.unwrap_err().reason(), Some(RejectReason::Duplicate));
    }

    /// A duplicate refusal counts only once the other side proved itself: one in place of
    /// the challenge (from an acceptor nothing authenticated) or of the response (a connector
    /// never decides duplicates) is refused as a protocol violation. (Duplicate refusals are
    /// not counted as failed handshakes, so one from anybody would hide failures.)
    #[tokio::test]
    async fn a_duplicate_refusal_before_the_proofs_is_a_protocol_violation() {
        let duplicate = Frame::Reject(Reject {
            reason: RejectReason::Duplicate,
            detail: "mine".into(),
        });
        // In place of the challenge.
        let (mut cr, mut cw, mut ar, mut aw) = wire();
        let c = Local::for_test("c", "k", b"s");
        let fake = async {
            ar.next().await.unwrap().unwrap();
            send(&mut aw, &duplicate, c.max_frame_len).await.unwrap();
        };
        let (res, ()) = tokio::join!(connect(&mut cr, &mut cw, &c, Lane::User, soon()), fake);
        let e = res.unwrap_err();
        assert!(
            matches!(
                e,
                HandshakeError::Refused {
                    reason: RejectReason::Protocol,
                    ..
                }
            ),
            "{e}"
        );
        // In place of the response.
        let (mut cr, mut cw, mut ar, mut aw) = wire();
        let a = Local::for_test("a", "k", b"s");
        let fake = async {
            let hello = Frame::Hello(Hello {
                version: c.version,
                cluster: c.cluster.clone(),
                from: c.me.clone(),
                nonce: nonce(),
                lane: Lane::User,
                payload_format: c.payload_format.clone(),
            });
            send(&mut cw, &hello, c.max_frame_len).await.unwrap();
            cr.next().await.unwrap().unwrap(); // the challenge
            send(&mut cw, &duplicate, c.max_frame_len).await.unwrap();
        };
        let (res, ()) = tokio::join!(accept(&mut ar, &mut aw, &a, soon(), |_, _| Ok(())), fake);
        let e = res.unwrap_err();
        assert!(
            matches!(
                e,
                HandshakeError::Refused {
                    reason: RejectReason::Protocol,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn proofs_depend_on_role_secret_lane_and_nonces() {
        let c = Local::for_test("c", "k", b"s").me;
        let a = Local::for_test("a", "k", b"s").me;
        let t = Transcript {
            cluster: "k",
            lane: Lane::User,
            connector: &c,
            acceptor: &a,
            nonce_c: &[1; 32],
            nonce_a: &[2; 32],
        };
        let p = proof(b"s", true, t);
        assert_ne!(p, proof(b"s", false, t));
        assert_ne!(p, proof(b"t", true, t));
        let control = Transcript {
            lane: Lane::Control,
            ..t
        };
        assert_ne!(p, proof(b"s", true, control));
        let other_nonce = Transcript {
            nonce_a: &[3; 32],
            ..t
        };
        assert_ne!(p, proof(b"s", true, other_nonce));
        assert!(verify(b"s", true, t, &p));
    }

    #[tokio::test]
    async fn a_silent_peer_times_out() {
        let (cs, _keep) = tokio::io::duplex(4096);
        let (cr, mut cw) = tokio::io::split(cs);
        let mut cr = FramedRead::new(cr, BodyCodec::default());
        let c = Local::for_test("c", "k", b"s");
        let deadline = tokio::time::Instant::now() + Duration::from_millis(50);
        assert!(matches!(
            connect(&mut cr, &mut cw, &c, Lane::User, deadline).await,
            Err(HandshakeError::Timeout)
        ));
    }
}
