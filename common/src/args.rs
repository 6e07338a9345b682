//! [`Args`]: a job's command and its arguments.

use std::fmt;

use serde::de::{SeqAccess, Visitor};
use serde::ser::SerializeSeq;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::packed::{PackedIter, PackedStrs};

/// A command and its arguments, in one allocation ([`PackedStrs`]): the live state keeps one
/// per job. It encodes exactly as the `Vec<String>` it replaced (a sequence of strings), in
/// bincode and in JSON.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Args(PackedStrs);

impl Args {
    pub fn new() -> Args {
        Args::default()
    }

    pub fn iter(&self) -> PackedIter<'_> {
        self.0.iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The argument at `index` (the command itself at 0).
    pub fn get(&self, index: usize) -> Option<&str> {
        self.iter().nth(index)
    }

    pub fn first(&self) -> Option<&str> {
        self.iter().next()
    }

    /// Appends `arg` (copies the others: a command is built once).
    pub fn push(&mut self, arg: impl AsRef<str>) {
        self.extend([arg]);
    }

    pub fn to_vec(&self) -> Vec<String> {
        self.iter().map(str::to_string).collect()
    }
}

impl fmt::Debug for Args {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<S: AsRef<str>> FromIterator<S> for Args {
    fn from_iter<I: IntoIterator<Item = S>>(items: I) -> Args {
        Args(items.into_iter().collect())
    }
}

impl<S: AsRef<str>> Extend<S> for Args {
    fn extend<I: IntoIterator<Item = S>>(&mut self, args: I) {
        let mut all = self.to_vec();
        all.extend(args.into_iter().map(|arg| arg.as_ref().to_string()));
        *self = all.iter().collect();
    }
}

impl From<Vec<String>> for Args {
    fn from(args: Vec<String>) -> Args {
        args.iter().collect()
    }
}

impl<const N: usize> From<[&str; N]> for Args {
    fn from(args: [&str; N]) -> Args {
        args.iter().collect()
    }
}

impl<'a> IntoIterator for &'a Args {
    type Item = &'a str;
    type IntoIter = PackedIter<'a>;

    fn into_iter(self) -> PackedIter<'a> {
        self.iter()
    }
}

impl<S: AsRef<str>> PartialEq<[S]> for Args {
    fn eq(&self, other: &[S]) -> bool {
        self.len() == other.len() && self.iter().zip(other).all(|(a, b)| a == b.as_ref())
    }
}

impl<S: AsRef<str>, const N: usize> PartialEq<[S; N]> for Args {
    fn eq(&self, other: &[S; N]) -> bool {
        *self == other[..]
    }
}

impl<S: AsRef<str>> PartialEq<Vec<S>> for Args {
    fn eq(&self, other: &Vec<S>) -> bool {
        *self == other[..]
    }
}

impl Serialize for Args {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.len()))?;
        for arg in self.iter() {
            seq.serialize_element(arg)?;
        }
        seq.end()
    }
}

impl<'de> Deserialize<'de> for Args {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Args, D::Error> {
        struct Strings;

        impl<'de> Visitor<'de> for Strings {
            type Value = Args;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of command arguments")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Args, A::Error> {
                // Packed as they come: no capacity from the length the input claims (it is
                // outside input), and no list of them in between.
                std::iter::from_fn(|| seq.next_element::<String>().transpose()).collect()
            }
        }

        deserializer.deserialize_seq(Strings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_encodes_as_the_vector_it_replaced() {
        let vec: Vec<String> = ["python", "train.py", "--config", "a:b.yaml", ""]
            .map(String::from)
            .to_vec();
        let args = Args::from(vec.clone());
        assert_eq!(args, vec);
        assert_eq!(args.to_vec(), vec);
        let config = bincode::config::standard();
        let ours = bincode::serde::encode_to_vec(&args, config).unwrap();
        let theirs = bincode::serde::encode_to_vec(&vec, config).unwrap();
        assert_eq!(ours, theirs, "the same bytes as the vector");
        let (back, _): (Args, usize) = bincode::serde::decode_from_slice(&theirs, config).unwrap();
        assert_eq!(back, args);
        assert_eq!(
            serde_json::to_string(&args).unwrap(),
            serde_json::to_string(&vec).unwrap()
        );
        let back: Args = serde_json::from_str(&serde_json::to_string(&vec).unwrap()).unwrap();
        assert_eq!(back, args);
        assert!(serde_json::from_str::<Args>(r#"["python", 3]"#).is_err());
        let mut more = args.clone();
        more.push("--lr");
        assert_eq!(more.len(), 6);
        assert_eq!(more.iter().last(), Some("--lr"));
        assert_eq!(format!("{args:?}"), format!("{vec:?}"));
    }
}
