//! The pprof profile in a Pyroscope push body: `multipart/form-data` with the profile in the
//! part named `profile` (as Pyroscope's SDKs send it; a `sample_type_config` part beside it is
//! not needed: the types are told by their names), or the body itself for any other type.
//! The body is in memory already, bounded by `--max-body`.

/// The profile's bytes in `body` sent as `content_type`.
pub(super) fn profile_part<'a>(body: &'a [u8], content_type: &str) -> Result<&'a [u8], String> {
    let (mime, params) = content_type.split_once(';').unwrap_or((content_type, ""));
    if !mime.trim().eq_ignore_ascii_case("multipart/form-data") {
        return Ok(body);
    }
    let boundary = (params.split(';'))
        .filter_map(|p| p.trim().split_once('='))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("boundary"))
        .map(|(_, v)| v.trim().trim_matches('"'))
        .filter(|b| !b.is_empty() && b.len() <= 70)
        .ok_or("multipart/form-data without a boundary")?;
    let delimiter = format!("--{boundary}");
    let mut rest = body;
    // Each part follows a delimiter line; the last delimiter ends in `--`.
    while let Some(at) = find(rest, delimiter.as_bytes()) {
        rest = &rest[at + delimiter.len()..];
        if rest.starts_with(b"--") {
            break;
        }
        let head_end = find(rest, b"\r\n\r\n").ok_or("a multipart part without headers' end")?;
        let (head, content) = (&rest[..head_end], &rest[head_end + 4..]);
        let end = find(content, format!("\r\n{delimiter}").as_bytes())
            .ok_or("a multipart part without a closing boundary")?;
        if part_name(head) == Some("profile") {
            return Ok(&content[..end]);
        }
        rest = &content[end..];
    }
    Err("the multipart body has no part named `profile`".into())
}

/// The `name` of a part's Content-Disposition, from its headers.
fn part_name(head: &[u8]) -> Option<&str> {
    let head = std::str::from_utf8(head).ok()?;
    let line = (head.split("\r\n"))
        .find(|l| l.to_ascii_lowercase().starts_with("content-disposition:"))?;
    line.split(';')
        .filter_map(|p| p.trim().strip_prefix("name="))
        .map(|n| n.trim_matches('"'))
        .next()
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the part named `profile` is found after another part, with its bytes exactly
    // (CR LF inside kept), and the refusals: no boundary, no such part, an unclosed part.
    #[test]
    fn the_profile_part_is_found_by_name() {
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"sample_type_config\"; filename=\"c.json\"\r\n\r\n{}\r\n--XyZ\r\nContent-Disposition: form-data; name=\"profile\"; filename=\"profile.pprof\"\r\nContent-Type: application/octet-stream\r\n\r\n\x1f\x8b\r\nbytes\r\n--XyZ--\r\n";
        let ct = "multipart/form-data; boundary=XyZ";
        assert_eq!(profile_part(body, ct).unwrap(), b"\x1f\x8b\r\nbytes");
        assert_eq!(
            profile_part(b"raw", "application/octet-stream").unwrap(),
            b"raw"
        );
        assert!(profile_part(body, "multipart/form-data").is_err());
        let other = b"--XyZ\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\n1\r\n--XyZ--\r\n";
        assert!(profile_part(other, ct)
            .unwrap_err()
            .contains("no part named"));
        let open = b"--XyZ\r\nContent-Disposition: form-data; name=\"profile\"\r\n\r\nabc";
        assert!(profile_part(open, ct)
            .unwrap_err()
            .contains("closing boundary"));
    }
}
