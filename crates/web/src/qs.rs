//! Query strings: the URL is the state of every page, so pages parse and build them by hand
//! (repeated keys such as `run=1&run=2` included, which serde_urlencoded does not support).

/// Parsed query: pairs in order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Query(pub Vec<(String, String)>);

impl Query {
    pub fn parse(raw: Option<&str>) -> Query {
        let mut out = Vec::new();
        for part in raw.unwrap_or("").split('&') {
            if part.is_empty() {
                continue;
            }
            let (k, v) = part.split_once('=').unwrap_or((part, ""));
            out.push((decode(k), decode(v)));
        }
        Query(out)
    }
    /// First non-empty value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, v)| k == key && !v.trim().is_empty())
            .map(|(_, v)| v.as_str())
    }
    pub fn all(&self, key: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .collect()
    }
    pub fn get_usize(&self, key: &str) -> Option<usize> {
        self.get(key).and_then(|v| v.trim().parse().ok())
    }
    pub fn get_i64(&self, key: &str) -> Option<i64> {
        self.get(key).and_then(|v| v.trim().parse().ok())
    }
    /// Values of `key` split on commas, plus repeated keys: `runs=1,2&runs=3` → [1, 2, 3].
    pub fn list(&self, key: &str) -> Vec<String> {
        self.all(key)
            .iter()
            .flat_map(|v| v.split(','))
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
    }
    /// A copy with `key` set to `value` (removed when `None`), other keys kept in order.
    pub fn with(&self, key: &str, value: Option<&str>) -> Query {
        let mut q: Vec<(String, String)> =
            self.0.iter().filter(|(k, _)| k != key).cloned().collect();
        if let Some(v) = value {
            q.push((key.into(), v.into()));
        }
        Query(q)
    }
    pub fn without(&self, keys: &[&str]) -> Query {
        Query(
            self.0
                .iter()
                .filter(|(k, _)| !keys.contains(&k.as_str()))
                .cloned()
                .collect(),
        )
    }
    /// "?a=1&b=2" (empty string when there are no pairs).
    pub fn to_string_with_qmark(&self) -> String {
        let s = self.encode();
        if s.is_empty() {
            String::new()
        } else {
            format!("?{s}")
        }
    }
    pub fn encode(&self) -> String {
        self.0
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
            .collect::<Vec<_>>()
            .join("&")
    }
}

/// Percent-decodes a query component (`+` is a space).
pub fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Percent-encodes everything but unreserved characters (RFC 3986) and a few safe ones.
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for &c in s.as_bytes() {
        if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.' | b'~' | b',' | b'/' | b':')
        {
            out.push(c as char);
        } else {
            out.push_str(&format!("%{c:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_repeated_keys() {
        let q = Query::parse(Some("runs=1,2&run=3&run=4&q=a+b%26c&x=%zz&empty="));
        assert_eq!(q.list("runs"), ["1", "2"]);
        assert_eq!(q.all("run"), ["3", "4"]);
        assert_eq!(q.get("q"), Some("a b&c"));
        assert_eq!(q.get("x"), Some("%zz"));
        assert_eq!(q.get("empty"), None);
        assert_eq!(Query::parse(Some(&q.encode())).get("q"), Some("a b&c"));
        assert_eq!(q.with("page", Some("2")).get("page"), Some("2"));
        assert_eq!(encode("<script>"), "%3Cscript%3E");
        assert_eq!(decode("%E2%9C%93"), "✓");
        assert_eq!(decode("100%"), "100%");
        assert_eq!(decode("%4"), "%4");
    }
}
