//! What the NIC does to packets besides moving them: TX checksum insertion and segmentation
//! (TSO for TCP, USO for UDP) as the descriptors ask, RX checksum verification and packet-type
//! classification for the write-back, VLAN tag insertion and stripping.

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const ETHERTYPE_VLAN: u16 = 0x8100;
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;

/// One's-complement sum of `data` (big-endian 16-bit words) added to `sum`.
///
/// One's-complement addition does not care about byte order or word size, so the data is summed
/// as little-endian 32-bit words into 64-bit accumulators (vectorised, with AVX2 where the CPU
/// has it), folded to 16 bits, and byte-swapped at the end.
pub fn sum16(data: &[u8], sum: u64) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        return sum + unsafe { sum_le_words_avx2(data) };
    }
    sum + sum_le_words(data)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn sum_le_words_avx2(data: &[u8]) -> u64 {
    sum_le_words(data)
}

/// The byte-swapped 16-bit one's-complement sum of `data` (see [`sum16`]).
#[inline(always)]
fn sum_le_words(data: &[u8]) -> u64 {
    let mut chunks = data.chunks_exact(4);
    let mut acc: u64 = (&mut chunks).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as u64).sum();
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut last = [0u8; 4];
        last[..rest.len()].copy_from_slice(rest);
        acc += u32::from_le_bytes(last) as u64;
    }
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    (acc as u16).swap_bytes() as u64
}

/// Folds a sum to the 16-bit one's-complement checksum.
pub fn fold(mut sum: u64) -> u16 {
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Network and transport layers of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layers {
    /// Where the L3 header starts (after Ethernet and VLAN tags).
    pub l3: usize,
    /// IPv4 (true) or IPv6 (false); `None` if neither.
    pub ipv4: Option<bool>,
    /// Where the L4 header starts, if known.
    pub l4: Option<usize>,
    /// TCP or UDP protocol number, if the L4 header is one of them and complete.
    pub proto: Option<u8>,
    /// A VLAN tag follows the MAC addresses.
    pub vlan: bool,
}

/// Finds the layers of an Ethernet frame.
pub fn parse(frame: &[u8]) -> Layers {
    let mut layers = Layers { l3: 14, ipv4: None, l4: None, proto: None, vlan: false };
    if frame.len() < 14 {
        return layers;
    }
    let mut ethertype = be16(frame, 12);
    if ethertype == ETHERTYPE_VLAN && frame.len() >= 18 {
        layers.vlan = true;
        layers.l3 = 18;
        ethertype = be16(frame, 16);
    }
    let l3 = layers.l3;
    let (l4, proto) = match ethertype {
        ETHERTYPE_IPV4 if frame.len() >= l3 + 20 && frame[l3] >> 4 == 4 => {
            layers.ipv4 = Some(true);
            let ihl = (frame[l3] & 0xf) as usize * 4;
            let fragment = be16(frame, l3 + 6) & 0x3fff != 0;
            if ihl < 20 || fragment {
                return layers;
            }
            (l3 + ihl, frame[l3 + 9])
        }
        ETHERTYPE_IPV6 if frame.len() >= l3 + 40 && frame[l3] >> 4 == 6 => {
            layers.ipv4 = Some(false);
            (l3 + 40, frame[l3 + 6])
        }
        _ => return layers,
    };
    layers.l4 = Some(l4);
    let complete = match proto {
        PROTO_TCP => frame.len() >= l4 + 20 && frame.len() >= l4 + (frame[l4 + 12] >> 4) as usize * 4,
        PROTO_UDP => frame.len() >= l4 + 8,
        _ => false,
    };
    if complete {
        layers.proto = Some(proto);
    }
    layers
}

/// The pseudo-header sum for an L4 segment of `l4_len` bytes.
fn pseudo_header(frame: &[u8], layers: &Layers, proto: u8, l4_len: usize) -> u64 {
    let l3 = layers.l3;
    let addresses = if layers.ipv4 == Some(true) { &frame[l3 + 12..l3 + 20] } else { &frame[l3 + 8..l3 + 40] };
    sum16(addresses, proto as u64 + l4_len as u64)
}

/// The L4 length the IP header claims (bounded by the frame).
fn l4_length(frame: &[u8], layers: &Layers, l4: usize) -> usize {
    let l3 = layers.l3;
    let end = if layers.ipv4 == Some(true) {
        l3 + be16(frame, l3 + 2) as usize
    } else {
        l3 + 40 + be16(frame, l3 + 4) as usize
    };
    end.min(frame.len()).saturating_sub(l4)
}

/// Writes the IPv4 header checksum.
fn fill_ipv4_checksum(frame: &mut [u8], l3: usize) {
    let ihl = (frame[l3] & 0xf) as usize * 4;
    frame[l3 + 10..l3 + 12].fill(0);
    let sum = fold(sum16(&frame[l3..l3 + ihl], 0));
    frame[l3 + 10..l3 + 12].copy_from_slice(&sum.to_be_bytes());
}

/// Writes the TCP or UDP checksum.
fn fill_l4_checksum(frame: &mut [u8], layers: &Layers) {
    let (Some(l4), Some(proto)) = (layers.l4, layers.proto) else { return };
    let len = l4_length(frame, layers, l4);
    let at = l4 + if proto == PROTO_TCP { 16 } else { 6 };
    frame[at..at + 2].fill(0);
    let mut sum = fold(sum16(&frame[l4..l4 + len], pseudo_header(frame, layers, proto, len)));
    if proto == PROTO_UDP && sum == 0 {
        sum = 0xffff;
    }
    frame[at..at + 2].copy_from_slice(&sum.to_be_bytes());
}

/// TX checksum offload: fills the checksums a descriptor asked for.
pub fn insert_checksums(frame: &mut [u8], ip: bool, l4: bool) {
    let layers = parse(frame);
    if ip && layers.ipv4 == Some(true) {
        fill_ipv4_checksum(frame, layers.l3);
    }
    if l4 {
        fill_l4_checksum(frame, &layers);
    }
}

/// Inserts an 802.1Q tag after the MAC addresses.
pub fn insert_vlan(frame: &[u8], tag: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(frame.len() + 4);
    out.extend_from_slice(&frame[..12.min(frame.len())]);
    out.extend_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
    out.extend_from_slice(&tag.to_be_bytes());
    out.extend_from_slice(&frame[12.min(frame.len())..]);
    out
}

/// Segmentation parameters from a TX context descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segmentation {
    /// Header lengths: L2, L3, L4.
    pub l2: usize,
    /// L3 header length.
    pub l3: usize,
    /// L4 header length.
    pub l4: usize,
    /// Payload bytes per segment.
    pub mss: usize,
    /// TCP (else UDP).
    pub tcp: bool,
    /// TCP flag masks for the first, middle and last segments (12 bits each).
    pub flag_masks: [u16; 3],
}

/// Splits `frame` (headers then payload) into segments of at most `mss` payload bytes, each with
/// its headers fixed up (lengths, IPv4 ID and checksum, TCP sequence and flags, L4 checksum).
pub fn segment(frame: &[u8], seg: &Segmentation, mut emit: impl FnMut(&[u8])) -> Result<(), &'static str> {
    let headers = seg.l2 + seg.l3 + seg.l4;
    if seg.mss == 0 || headers > frame.len() || seg.l3 < 20 || seg.l4 < 8 {
        return Err("segmentation headers do not fit the frame");
    }
    let layers = parse(frame);
    if layers.l3 != seg.l2 || layers.l4 != Some(seg.l2 + seg.l3) {
        return Err("segmentation headers disagree with the frame");
    }
    let ipv4 = layers.ipv4 == Some(true);
    let proto = if seg.tcp { PROTO_TCP } else { PROTO_UDP };
    let payload = &frame[headers..];
    let chunks = payload.len().div_ceil(seg.mss).max(1);
    let l3 = seg.l2;
    let l4 = l3 + seg.l3;
    let ip_id = if ipv4 { be16(frame, l3 + 4) } else { 0 };
    let seq = if seg.tcp { u32::from_be_bytes(frame[l4 + 4..l4 + 8].try_into().expect("4 bytes")) } else { 0 };
    let mut out = Vec::with_capacity(headers + seg.mss);
    for i in 0..chunks {
        let start = i * seg.mss;
        let data = &payload[start.min(payload.len())..(start + seg.mss).min(payload.len())];
        out.clear();
        out.extend_from_slice(&frame[..headers]);
        out.extend_from_slice(data);
        let l4_len = seg.l4 + data.len();
        if ipv4 {
            out[l3 + 2..l3 + 4].copy_from_slice(&((seg.l3 + l4_len) as u16).to_be_bytes());
            out[l3 + 4..l3 + 6].copy_from_slice(&ip_id.wrapping_add(i as u16).to_be_bytes());
            fill_ipv4_checksum(&mut out, l3);
        } else {
            out[l3 + 4..l3 + 6].copy_from_slice(&((seg.l3 - 40 + l4_len) as u16).to_be_bytes());
        }
        if seg.tcp {
            out[l4 + 4..l4 + 8].copy_from_slice(&seq.wrapping_add(start as u32).to_be_bytes());
            let mask = match i {
                0 if chunks == 1 => 0xfff,
                0 => seg.flag_masks[0],
                _ if i == chunks - 1 => seg.flag_masks[2],
                _ => seg.flag_masks[1],
            };
            let flags = be16(&out, l4 + 12);
            let kept = (flags & 0xf000) | (flags & 0x0fff & mask);
            out[l4 + 12..l4 + 14].copy_from_slice(&kept.to_be_bytes());
        } else {
            out[l4 + 4..l4 + 6].copy_from_slice(&(l4_len as u16).to_be_bytes());
        }
        let seg_layers = Layers { proto: Some(proto), ..layers };
        fill_l4_checksum(&mut out, &seg_layers);
        emit(&out);
    }
    Ok(())
}

/// A received frame's network layer, as a NIC's parser classifies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum L3 {
    /// IPv4.
    Ipv4,
    /// IPv6.
    Ipv6,
    /// Anything else.
    #[default]
    Other,
}

/// A received frame's transport layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum L4 {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// Anything else (or none).
    #[default]
    Other,
}

/// What checking one checksum found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Checksum {
    /// Not checked: checking is off, or the frame has no such checksum.
    #[default]
    Unchecked,
    /// Checked and right (a UDP datagram without a checksum counts as right).
    Good,
    /// Checked and wrong.
    Bad,
}

/// What RX checking found, independent of any NIC: each NIC encodes it into its own write-back
/// bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RxCheck {
    /// The network layer.
    pub l3: L3,
    /// The transport layer.
    pub l4: L4,
    /// Whether the frame (still) carries an 802.1Q tag.
    pub vlan: bool,
    /// The IPv4 header checksum.
    pub ip_checksum: Checksum,
    /// The TCP or UDP checksum.
    pub l4_checksum: Checksum,
}

/// Classifies a received frame and verifies the checksums the driver enabled checking for.
pub fn check_rx(frame: &[u8], check_ip: bool, check_l4: bool) -> RxCheck {
    let layers = parse(frame);
    let mut result = RxCheck {
        l3: match layers.ipv4 {
            Some(true) => L3::Ipv4,
            Some(false) => L3::Ipv6,
            None => L3::Other,
        },
        l4: match layers.proto {
            Some(PROTO_TCP) => L4::Tcp,
            Some(PROTO_UDP) => L4::Udp,
            _ => L4::Other,
        },
        vlan: layers.vlan,
        ..RxCheck::default()
    };
    if check_ip && layers.ipv4 == Some(true) {
        let ihl = (frame[layers.l3] & 0xf) as usize * 4;
        let bad = frame.len() < layers.l3 + ihl || fold(sum16(&frame[layers.l3..layers.l3 + ihl], 0)) != 0;
        result.ip_checksum = if bad { Checksum::Bad } else { Checksum::Good };
    }
    if let (true, Some(l4), Some(proto)) = (check_l4, layers.l4, layers.proto) {
        let len = l4_length(frame, &layers, l4);
        let udp_without_checksum = proto == PROTO_UDP && be16(frame, l4 + 6) == 0;
        let good =
            udp_without_checksum || fold(sum16(&frame[l4..l4 + len], pseudo_header(frame, &layers, proto, len))) == 0;
        result.l4_checksum = if good { Checksum::Good } else { Checksum::Bad };
    }
    result
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An Ethernet/IPv4/UDP frame with valid checksums.
    pub fn udp4(payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 42];
        f[..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        f[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        f[14] = 0x45;
        f[16..18].copy_from_slice(&((28 + payload.len()) as u16).to_be_bytes());
        f[22] = 64;
        f[23] = PROTO_UDP;
        f[26..30].copy_from_slice(&[10, 0, 0, 1]);
        f[30..34].copy_from_slice(&[10, 0, 0, 2]);
        f[34..36].copy_from_slice(&5000u16.to_be_bytes());
        f[36..38].copy_from_slice(&5001u16.to_be_bytes());
        f[38..40].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        f.extend_from_slice(payload);
        insert_checksums(&mut f, true, true);
        f
    }

    /// An Ethernet/IPv6/TCP frame (ACK|PSH|FIN) with a valid checksum.
    fn tcp6(payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 40 + 20];
        f[12..14].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
        f[14] = 0x60;
        f[18..20].copy_from_slice(&((20 + payload.len()) as u16).to_be_bytes());
        f[20] = PROTO_TCP;
        f[21] = 64;
        f[22 + 15] = 1;
        f[38 + 15] = 2;
        f[54 + 4..54 + 8].copy_from_slice(&1000u32.to_be_bytes());
        f[54 + 12] = 5 << 4;
        f[54 + 13] = 0x19; // ACK PSH FIN
        f.extend_from_slice(payload);
        insert_checksums(&mut f, false, true);
        f
    }

    /// The RFC 1071 way, one big-endian word at a time.
    fn slow_sum(data: &[u8]) -> u16 {
        let mut sum = 0u64;
        for pair in data.chunks(2) {
            sum += (pair[0] as u64) << 8 | pair.get(1).copied().unwrap_or(0) as u64;
        }
        fold(sum)
    }

    proptest::proptest! {
        #[test]
        fn fast_sum_matches_rfc1071(data in proptest::collection::vec(proptest::num::u8::ANY, 0..300), seed in 0u64..0x1_0000) {
            proptest::prop_assert_eq!(fold(sum16(&data, seed)), fold(seed + (!slow_sum(&data)) as u64));
        }
    }

    #[test]
    fn checksums_verify_and_detect_damage() {
        let f = udp4(b"hello, world");
        let check = check_rx(&f, true, true);
        assert_eq!((check.l3, check.l4, check.vlan), (L3::Ipv4, L4::Udp, false), "IPv4 UDP");
        assert_eq!((check.ip_checksum, check.l4_checksum), (Checksum::Good, Checksum::Good));
        let mut bad = f.clone();
        *bad.last_mut().unwrap() ^= 0xff;
        assert_eq!(check_rx(&bad, true, true).l4_checksum, Checksum::Bad);
        bad[24] ^= 1;
        assert_eq!(check_rx(&bad, true, true).ip_checksum, Checksum::Bad);
        let off = check_rx(&f, false, false);
        assert_eq!((off.ip_checksum, off.l4_checksum), (Checksum::Unchecked, Checksum::Unchecked), "checking off");
        let other = check_rx(&[0u8; 60], true, true);
        assert_eq!((other.l3, other.l4, other.l4_checksum), (L3::Other, L4::Other, Checksum::Unchecked), "not IP");
        let v6 = check_rx(&tcp6(b"x"), true, true);
        assert_eq!((v6.l3, v6.l4, v6.ip_checksum), (L3::Ipv6, L4::Tcp, Checksum::Unchecked), "IPv6 TCP");
        assert_eq!(check_rx(&tcp6(b"xyz"), true, true).l4_checksum, Checksum::Good);
    }

    #[test]
    fn tcp_segmentation_fixes_every_header() {
        let payload: Vec<u8> = (0..2500u32).map(|i| i as u8).collect();
        let frame = tcp6(&payload);
        let seg = Segmentation { l2: 14, l3: 40, l4: 20, mss: 1000, tcp: true, flag_masks: [0xff6, 0xff6, 0xf7f] };
        let mut out = Vec::new();
        segment(&frame, &seg, |s| out.push(s.to_vec())).unwrap();
        assert_eq!(out.len(), 3);
        for (i, s) in out.iter().enumerate() {
            let want = if i == 2 { 500 } else { 1000 };
            assert_eq!(s.len(), 74 + want);
            assert_eq!(be16(s, 18) as usize, 20 + want, "IPv6 payload length");
            assert_eq!(u32::from_be_bytes(s[58..62].try_into().unwrap()), 1000 + 1000 * i as u32, "sequence");
            assert_eq!(&s[74..], &payload[i * 1000..i * 1000 + want]);
            assert_eq!(check_rx(s, true, true).l4_checksum, Checksum::Good);
        }
        assert_eq!(out[0][67] & 0x09, 0, "no FIN/PSH on the first segment");
        assert_eq!(out[2][67] & 0x09, 0x09, "FIN/PSH on the last");
    }

    #[test]
    fn udp_segmentation_and_vlan() {
        let payload = vec![7u8; 3000];
        let frame = udp4(&payload);
        let seg = Segmentation { l2: 14, l3: 20, l4: 8, mss: 1472, tcp: false, flag_masks: [0xfff; 3] };
        let mut sizes = Vec::new();
        segment(&frame, &seg, |s| {
            assert_eq!(check_rx(s, true, true).l4_checksum, Checksum::Good);
            assert_eq!(be16(s, 16) as usize, s.len() - 14, "IPv4 total length");
            sizes.push(s.len());
        })
        .unwrap();
        assert_eq!(sizes, vec![1514, 1514, 98]);
        assert!(segment(&frame, &Segmentation { l3: 40, ..seg }, |_| {}).is_err(), "headers disagree");
        assert!(segment(&frame[..20], &seg, |_| {}).is_err());
        let tagged = insert_vlan(&frame, 0x0123);
        assert!(check_rx(&tagged, true, true).vlan);
        assert_eq!(parse(&tagged).l3, 18);
    }
}
