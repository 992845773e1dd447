//! The HTTP edge shared by the routes, the checks of spec section 2 and the event
//! stream: the response body type and the decoding of query components. It imports no
//! other module of the crate.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;

/// The body of every response.
pub(crate) type Body = BoxBody<Bytes, Infallible>;

/// Decodes `%XX` escapes and `+` (a space) of a query component.
pub(crate) fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_queries() {
        assert_eq!(percent_decode("a%40b%3A1%2F%5B0%5D+x"), "a@b:1/[0] x");
        assert_eq!(percent_decode("50%"), "50%");
        assert_eq!(percent_decode("%zz"), "%zz");
    }
}
