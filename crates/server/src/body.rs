//! Request bodies: read with a cap, then undo `Content-Encoding` (zstd, gzip) with a cap on the decompressed size.

use onepass_decide::ApiError;
use std::io::Read;

/// The 413 for a body past `--max-body-bytes` (raw or decompressed).
pub fn too_large(max: usize, after_decompression: bool) -> ApiError {
    ApiError::detail(
        413,
        format!(
            "request body too large: more than {max} bytes{} (--max-body-bytes)",
            if after_decompression {
                " after decompression"
            } else {
                ""
            }
        ),
    )
}

/// Why a body could not be read: past the size cap (413), or cut short / badly framed (400: a truncated body, a bad
/// chunk-size line, a chunked body without its last chunk), never counted as "too large".
pub fn read_error(e: &axum::Error, max: usize) -> ApiError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if s.is::<http_body_util::LengthLimitError>() {
            return too_large(max, false);
        }
        source = s.source();
    }
    ApiError::detail(
        400,
        format!("the request body could not be read in full ({e}); send a complete body matching its Content-Length or chunked framing"),
    )
}

/// The 408 for a body that did not arrive in time.
pub fn timed_out(limit: std::time::Duration) -> ApiError {
    ApiError::detail(
        408,
        format!(
            "the request body did not arrive within {} s (--body-timeout); send it faster or raise the limit",
            limit.as_secs_f64()
        ),
    )
}

/// Undo the `Content-Encoding` header's codings (applied in order, so undone last first). `identity`, `gzip`,
/// `x-gzip` and `zstd` are known; anything else is a 415.
pub fn decode(encoding: Option<&str>, raw: Vec<u8>, max: usize) -> Result<Vec<u8>, ApiError> {
    let Some(enc) = encoding else { return Ok(raw) };
    let mut body = raw;
    for coding in enc.split(',').map(|c| c.trim().to_ascii_lowercase()).rev() {
        body = match coding.as_str() {
            "" | "identity" => body,
            "zstd" => {
                let dec = zstd::stream::read::Decoder::new(&body[..]).map_err(|e| bad("zstd", &e))?;
                read_capped(dec, max, "zstd")?
            }
            "gzip" | "x-gzip" => read_capped(flate2::read::MultiGzDecoder::new(&body[..]), max, "gzip")?,
            other => {
                return Err(ApiError::detail(
                    415,
                    format!("unsupported Content-Encoding {other:?}: send the body as identity, gzip or zstd"),
                ))
            }
        };
    }
    Ok(body)
}

fn read_capped(r: impl Read, max: usize, what: &str) -> Result<Vec<u8>, ApiError> {
    let mut out = Vec::new();
    r.take(max as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| bad(what, &e))?;
    if out.len() > max {
        return Err(too_large(max, true));
    }
    Ok(out)
}

fn bad(what: &str, e: &std::io::Error) -> ApiError {
    ApiError::detail(
        400,
        format!("the request body is not valid {what} data: {e}"),
    )
}
