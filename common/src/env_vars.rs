//! A job's environment variables: [`EnvVars`].

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;

use crate::packed::{PackedIter, PackedStrs};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Names to values, sorted by name, each name once: a job's environment.
///
/// Names and values in turn, packed in one allocation ([`PackedStrs`]) rather than a
/// `BTreeMap` (a map's first node has room for eleven pairs whatever it holds, about 550
/// bytes for the two or three variables a job usually sets) or a vector of string pairs (an
/// allocation per string): the live state holds one per job (a million jobs; docs:
/// BENCHMARKS.md, the live state). Lookups scan, which is cheap at the few variables a job
/// sets (at most `ENV_ENTRIES_MAX`). It encodes exactly as the `BTreeMap` it replaced: a
/// map, in name order.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct EnvVars(PackedStrs);

impl EnvVars {
    pub fn new() -> EnvVars {
        EnvVars(PackedStrs::new())
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| value)
    }

    pub fn contains_key(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// Sets `name` to `value`; the value it had, if any.
    pub fn insert(&mut self, name: String, value: String) -> Option<String> {
        let old = self.get(&name).map(str::to_string);
        let pairs: Vec<(&str, &str)> = self
            .iter()
            .filter(|(key, _)| *key != name)
            .chain([(name.as_str(), value.as_str())])
            .collect();
        *self = EnvVars::sorted(pairs);
        old
    }

    pub fn remove(&mut self, name: &str) -> Option<String> {
        let old = self.get(name).map(str::to_string)?;
        let kept: Vec<(&str, &str)> = self.iter().filter(|(key, _)| *key != name).collect();
        *self = EnvVars::sorted(kept);
        Some(old)
    }

    /// Packs `pairs`, each name once, sorting them by name.
    fn sorted(mut pairs: Vec<(&str, &str)>) -> EnvVars {
        pairs.sort_by(|a, b| a.0.cmp(b.0));
        EnvVars(pairs.into_iter().flat_map(|(k, v)| [k, v]).collect())
    }

    pub fn len(&self) -> usize {
        self.0.len() / 2
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The variables in name order.
    pub fn iter(&self) -> Pairs<'_> {
        Pairs(self.0.iter())
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> + '_ {
        self.iter().map(|(key, _)| key)
    }

    /// The variables as a `BTreeMap`.
    pub fn to_map(&self) -> BTreeMap<String, String> {
        self.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }
}

impl fmt::Debug for EnvVars {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// An environment's variables, `(name, value)`, in name order.
#[derive(Debug, Clone)]
pub struct Pairs<'a>(PackedIter<'a>);

impl<'a> Iterator for Pairs<'a> {
    type Item = (&'a str, &'a str);

    fn next(&mut self) -> Option<(&'a str, &'a str)> {
        Some((self.0.next()?, self.0.next()?))
    }
}

impl std::ops::Index<&str> for EnvVars {
    type Output = str;

    /// The value of `name`; panics when it is not set, as a map's index does.
    fn index(&self, name: &str) -> &str {
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
        EnvVars(
            kept.iter()
                .flat_map(|(k, v)| [k.as_str(), v.as_str()])
                .collect(),
        )
    }
}

impl Extend<(String, String)> for EnvVars {
    fn extend<I: IntoIterator<Item = (String, String)>>(&mut self, pairs: I) {
        let vars = self
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .chain(pairs);
        *self = vars.collect();
    }
}

impl From<BTreeMap<String, String>> for EnvVars {
    fn from(map: BTreeMap<String, String>) -> EnvVars {
        // Already sorted, each name once.
        EnvVars(
            map.iter()
                .flat_map(|(k, v)| [k.as_str(), v.as_str()])
                .collect(),
        )
    }
}

impl<const N: usize> From<[(String, String); N]> for EnvVars {
    fn from(pairs: [(String, String); N]) -> EnvVars {
        pairs.into_iter().collect()
    }
}

impl<'a> IntoIterator for &'a EnvVars {
    type Item = (&'a str, &'a str);
    type IntoIter = Pairs<'a>;

    fn into_iter(self) -> Pairs<'a> {
        self.iter()
    }
}

impl Serialize for EnvVars {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.len()))?;
        for (name, value) in self.iter() {
            map.serialize_entry(name, value)?;
        }
        map.end()
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
        assert_eq!(&vars["SEED"], "8");
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
        let names: Vec<&str> = edited.keys().collect();
        assert_eq!(names, ["A", "B", "SEED"]);
        assert!(edited.contains_key("B") && !edited.contains_key("M"));
        let mut extended = edited.clone();
        extended.extend([("A".to_string(), "9".to_string()), ("Z".into(), "z".into())]);
        assert_eq!(extended.keys().collect::<Vec<_>>(), ["A", "B", "SEED", "Z"]);
        assert_eq!(&extended["A"], "9");
    }
}
