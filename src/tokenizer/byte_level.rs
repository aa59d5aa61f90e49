//! GPT-2's byte-level alphabet: every byte is shown as one printable code point so that BPE
//! vocabularies can be stored as text. Printable Latin-1 bytes stand for themselves; the 68 others
//! (controls, space, DEL, NBSP, soft hyphen, …) are shifted to U+0100 onwards, in byte order.

/// Whether `byte` is one of the bytes that GPT-2 keeps as its own code point.
const fn maps_to_itself(byte: u8) -> bool {
    matches!(byte, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// `BYTE_TO_CHAR[b]` is the code point that stands for byte `b`.
pub(crate) const BYTE_TO_CHAR: [char; 256] = {
    let mut table = ['\0'; 256];
    let mut shifted = 0u32;
    let mut b = 0usize;
    while b < 256 {
        let cp = if maps_to_itself(b as u8) {
            b as u32
        } else {
            shifted += 1;
            255 + shifted
        };
        table[b] = match char::from_u32(cp) {
            Some(c) => c,
            None => panic!("byte-level code points are all valid"),
        };
        b += 1;
    }
    table
};

/// Number of bytes that are shifted to U+0100 onwards.
const N_SHIFTED: usize = 68;

/// `SHIFTED_TO_BYTE[k]` is the byte shown as U+0100 + k.
const SHIFTED_TO_BYTE: [u8; N_SHIFTED] = {
    let mut table = [0u8; N_SHIFTED];
    let mut k = 0usize;
    let mut b = 0usize;
    while b < 256 {
        if !maps_to_itself(b as u8) {
            table[k] = b as u8;
            k += 1;
        }
        b += 1;
    }
    assert!(k == N_SHIFTED);
    table
};

/// The byte that code point `c` stands for, if `c` is in the byte-level alphabet.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    let cp = u32::from(c);
    if let Ok(b) = u8::try_from(cp) {
        return maps_to_itself(b).then_some(b);
    }
    let k = usize::try_from(cp - 256).ok()?;
    SHIFTED_TO_BYTE.get(k).copied()
}

/// Decodes a vocabulary entry back to raw bytes the way llama.cpp's `llama_decode_text` does:
/// every code point outside the byte-level alphabet is replaced by an `[UNK_BYTE_0x..]` marker.
pub(crate) fn decode_token_text(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut utf8 = [0u8; 4];
                for b in c.encode_utf8(&mut utf8).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_is_a_bijection() {
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = BYTE_TO_CHAR[usize::from(b)];
            assert!(seen.insert(c));
            assert_eq!(char_to_byte(c), Some(b));
        }
        assert_eq!(BYTE_TO_CHAR[usize::from(b' ')], 'Ġ');
        assert_eq!(BYTE_TO_CHAR[usize::from(b'\n')], 'Ċ');
        assert_eq!(char_to_byte('A'), Some(b'A'));
        assert_eq!(char_to_byte('\u{144}'), None);
        assert_eq!(char_to_byte(' '), None);
    }

    #[test]
    fn unknown_code_points_get_llama_cpp_marker() {
        assert_eq!(decode_token_text("aĠb"), b"a b");
        assert_eq!(decode_token_text("x€"), b"x[UNK_BYTE_0xe282acx\xe2\x82\xac]".to_vec());
    }
}
