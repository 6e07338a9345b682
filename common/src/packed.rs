//! [`PackedStrs`]: a short list of strings kept in one allocation.
//!
//! A job's command and environment are a handful of short strings each, kept in the live
//! state for every job (a million jobs at a time). As `Vec<String>` each string is an
//! allocation of its own plus the vector's, about 170 bytes for a command of four arguments
//! with the allocator's rounding; packed, they take one allocation of their total length
//! plus a few bytes (BENCHMARKS.md, the live state at a million jobs).
//!
//! Each string is stored as its length in bytes in decimal, a `:`, then its bytes, so any
//! string can be held and the whole stays one valid `str`.

use std::fmt::{self, Write as _};

/// Strings in order, packed into one `str`. See the module docs.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct PackedStrs(Box<str>);

impl PackedStrs {
    pub fn new() -> PackedStrs {
        PackedStrs::default()
    }

    pub fn iter(&self) -> PackedIter<'_> {
        PackedIter { rest: &self.0 }
    }

    pub fn len(&self) -> usize {
        self.iter().count()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<S: AsRef<str>> FromIterator<S> for PackedStrs {
    fn from_iter<I: IntoIterator<Item = S>>(items: I) -> PackedStrs {
        let mut packed = String::new();
        for item in items {
            let item = item.as_ref();
            // Writing to a String cannot fail.
            let _ = write!(packed, "{}:", item.len());
            packed.push_str(item);
        }
        PackedStrs(packed.into_boxed_str())
    }
}

impl fmt::Debug for PackedStrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// The strings of a [`PackedStrs`], in order.
#[derive(Debug, Clone)]
pub struct PackedIter<'a> {
    rest: &'a str,
}

impl<'a> Iterator for PackedIter<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        // Only `FromIterator` builds the text, so it always parses; were it not to, the list
        // would end there rather than panic.
        let (len, rest) = self.rest.split_once(':')?;
        let len: usize = len.parse().ok()?;
        let item = rest.get(..len)?;
        self.rest = &rest[len..];
        Some(item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_strings_come_back_as_they_went_in() {
        let items = ["python", "", "a:b", "12:x", "ünïcödé", "--lr=3e-4"];
        let packed: PackedStrs = items.iter().collect();
        assert_eq!(packed.iter().collect::<Vec<_>>(), items);
        assert_eq!(packed.len(), items.len());
        assert!(!packed.is_empty());
        let empty = PackedStrs::new();
        assert!(empty.is_empty());
        assert_eq!(empty.iter().count(), 0);
        let one_empty: PackedStrs = [""].iter().collect();
        assert_eq!(one_empty.len(), 1, "an empty string is still an item");
        assert_eq!(format!("{packed:?}"), format!("{items:?}"));
    }
}
