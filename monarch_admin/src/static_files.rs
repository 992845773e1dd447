//! The dashboard page, embedded in the binary from `monarch_admin/static/`.

/// `(path, content type, bytes)` of every embedded file.
const FILES: [(&str, &str, &[u8]); 3] = [
    (
        "/",
        "text/html; charset=utf-8",
        include_bytes!("../static/index.html"),
    ),
    (
        "/static/app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../static/app.js"),
    ),
    (
        "/static/app.css",
        "text/css; charset=utf-8",
        include_bytes!("../static/app.css"),
    ),
];

/// The content type and bytes served at `path`, if it is an embedded file.
pub(crate) fn lookup(path: &str) -> Option<(&'static str, &'static [u8])> {
    let path = if path == "/index.html" { "/" } else { path };
    FILES
        .iter()
        .find(|(p, _, _)| *p == path)
        .map(|(_, ty, bytes)| (*ty, *bytes))
}
