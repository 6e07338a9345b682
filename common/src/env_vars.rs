//! A job's environment variables: [`EnvVars`].

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Names to values, sorted by name, each name once: a job's environment.
///
/// A sorted vector rather than a `BTreeMap`: a map's first node has room for eleven pairs
/// whatever it holds, about 550 bytes for the two or three variables a job usually sets, and
/// the live state holds one per job (a million jobs, half a GiB; docs: BENCHMARKS.md, the
/// restart). It encodes exactly as the `BTreeMap` it replaced: a map, in name order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvVars(Vec<(String, String)>);

impl EnvVars {
    pub fn new() -> EnvVars {
        EnvVars(Vec::new())
    }

    fn find(&self, name: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(key, _)| key.as_str().cmp(name))
    }

    pub fn get(&self, name: &str) -> Option<&String> {
        self.find(name).ok().map(|at| &self.0[at].1)
    }

    pub fn contains_key(&self, name: &str) -> bool {
        self.find(name).is_ok()
    }

    /// Sets `name` to `value`; the value it had, if any.
    pub fn insert(&mut self, name: String, value: String) -> Option<String> {
        match self.find(&name) {
            Ok(at) => Some(std::mem::replace(&mut self.0[at].1, value)),
            Err(at) => {
                self.0.insert(at, (name, value));
                None
            }
        }
    }

    pub fn remove(&mut self, name: &str) -> Option<String> {
        self.find(name).ok().map(|at| self.0.remove(at).1)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The variables in name order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&String, &String)> + '_ {
        self.0.iter().map(|(key, value)| (key, value))
    }

    pub fn keys(&self) -> impl ExactSizeIterator<Item = &String> + '_ {
        self.0.iter().map(|(key, _)| key)
    }

    /// The variables as a `BTreeMap`.
    pub fn to_map(&self) -> BTreeMap<String, String> {
        self.0.iter().cloned().collect()
    }
}

impl std::ops::Index<&str> for EnvVars {
    type Output = String;

    /// The value of `name`; panics when it is not set, as a map's index does.
    fn index(&self, name: &str) -> &String {
        self.get(name)
            .unwrap_or_else(|| panic!("no environment variable {name}"))
    }
}

impl FromIterator<(String, String)> for EnvVars {
    /// Later pairs win over earlier ones of the same name, as inserting them in turn would.
    fn from_iter<I: IntoIterator<Item = (String, String)>>(pairs: I) -> EnvVars {
        let mut vars: Vec<(String, String)> = pairs.into_iter().collect();
        // Stable: among pairs of one name, the last stays last, and is the one kept.
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        let mut kept: Vec<(String, String)> = Vec::with_capacity(vars.len());
        for pair in vars {
            match kept.last_mut() {
                Some(last) if last.0 == pair.0 => *last = pair,
                _ => kept.push(pair),
            }
        }
        kept.shrink_to_fit();
        EnvVars(kept)
    }
}

impl Extend<(String, String)> for EnvVars {
    fn extend<I: IntoIterator<Item = (String, String)>>(&mut self, pairs: I) {
        for (name, value) in pairs {
            self.insert(name, value);
        }
    }
}

impl From<BTreeMap<String, String>> for EnvVars {
    fn from(map: BTreeMap<String, String>) -> EnvVars {
        // Already sorted, each name once.
        EnvVars(map.into_iter().collect())
    }
}

impl<const N: usize> From<[(String, String); N]> for EnvVars {
    fn from(pairs: [(String, String); N]) -> EnvVars {
        pairs.into_iter().collect()
    }
}

impl IntoIterator for EnvVars {
    type Item = (String, String);
    type IntoIter = std::vec::IntoIter<(String, String)>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

/// A pair as a map's iterator gives it.
fn as_refs(pair: &(String, String)) -> (&String, &String) {
    (&pair.0, &pair.1)
}

impl<'a> IntoIterator for &'a EnvVars {
    type Item = (&'a String, &'a String);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (String, String)>,
        fn(&(String, String)) -> (&String, &String),
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.0
            .iter()
            .map(as_refs as fn(&(String, String)) -> (&String, &String))
    }
}

impl Serialize for EnvVars {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

impl<'de> Deserialize<'de> for EnvVars {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<EnvVars, D::Error> {
        struct Pairs;

        impl<'de> Visitor<'de> for Pairs {
            type Value = EnvVars;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of environment variables")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<EnvVars, A::Error> {
                // No capacity from the length the input claims: it is outside input.
                let mut pairs = Vec::new();
                while let Some(pair) = map.next_entry::<String, String>()? {
                    pairs.push(pair);
                }
                Ok(pairs.into_iter().collect())
            }
        }

        deserializer.deserialize_map(Pairs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn it_behaves_as_a_map_and_encodes_as_one() {
        let items = pairs(&[("SEED", "7"), ("A", "1"), ("SEED", "8"), ("M", "x")]);
        let vars: EnvVars = items.clone().into_iter().collect();
        let map: BTreeMap<String, String> = items.into_iter().collect();
        assert_eq!(vars.to_map(), map);
        assert_eq!(vars["SEED"], "8");
        assert_eq!(vars.len(), 3);
        let config = bincode::config::standard();
        let ours = bincode::serde::encode_to_vec(&vars, config).unwrap();
        let theirs = bincode::serde::encode_to_vec(&map, config).unwrap();
        assert_eq!(ours, theirs, "the same bytes as the map");
        let (back, _): (EnvVars, usize) =
            bincode::serde::decode_from_slice(&theirs, config).unwrap();
        assert_eq!(back, vars);
        assert_eq!(
            serde_json::to_string(&vars).unwrap(),
            serde_json::to_string(&map).unwrap()
        );
        let mut edited = vars.clone();
        assert_eq!(edited.insert("B".into(), "2".into()), None);
        assert_eq!(edited.insert("A".into(), "0".into()), Some("1".into()));
        assert_eq!(edited.remove("M"), Some("x".into()));
        let names: Vec<&String> = edited.keys().collect();
        assert_eq!(names, ["A", "B", "SEED"]);
        assert!(edited.contains_key("B") && !edited.contains_key("M"));
    }
}
