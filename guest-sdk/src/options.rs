//! The options an adapter takes, as one table ([`Spec`]s) that feeds both `describe` (what
//! `inspect` shows) and `init` (typed reading with a clear `bad-request` for an unknown option,
//! one given twice, or a bad value).

use crate::Error;

/// The option naming how long a delivery stays with its consumer before the broker may hand it
/// to another (a lease, a visibility timeout, an `ack_wait`); kept alive while held. One name on
/// every broker.
pub const VISIBILITY_MS: &str = "queue.visibilityMs";

/// One option of an adapter.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    /// Its name, e.g. `retention.maxEntries`.
    pub name: &'static str,
    /// Its default, as text (empty: none).
    pub default: &'static str,
    /// One line on what it does.
    pub doc: &'static str,
}

/// The options `init` received, read against the adapter's table.
pub struct Options {
    table: &'static [Spec],
    given: Vec<(String, String)>,
}

impl Options {
    /// Check the options `init` received against `table`: a name the table lacks, or one
    /// given twice, is a bad request.
    pub fn new(table: &'static [Spec], given: Vec<(String, String)>) -> Result<Self, Error> {
        for (i, (name, _)) in given.iter().enumerate() {
            if given[..i].iter().any(|(n, _)| n == name) {
                return Err(Error::bad_request(format!("option `{name}` given twice")));
            }
        }
        let unknown: Vec<&str> = given
            .iter()
            .map(|(n, _)| n.as_str())
            .filter(|n| !table.iter().any(|s| s.name == *n))
            .collect();
        if !unknown.is_empty() {
            let known: Vec<&str> = table.iter().map(|s| s.name).collect();
            return Err(Error::bad_request(format!(
                "unknown option(s): {} (this adapter takes: {})",
                unknown.join(", "),
                known.join(", ")
            )));
        }
        Ok(Self { table, given })
    }

    /// Option `name` as text: the given value, else its default; none when both are empty.
    pub fn text(&self, name: &str) -> Option<String> {
        self.given
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .or_else(|| Some(self.spec(name).default.to_string()))
            .filter(|v| !v.is_empty())
    }

    /// Option `name` parsed as `T` (the given value, else its default).
    pub fn get<T: std::str::FromStr>(&self, name: &str) -> Result<T, Error>
    where
        T::Err: std::fmt::Display,
    {
        let text = self.text(name).unwrap_or_default();
        text.trim()
            .parse::<T>()
            .map_err(|e| Error::bad_request(format!("option `{name}`: cannot read `{text}`: {e}")))
    }

    /// Option `name` as a number of at least `min`.
    pub fn at_least(&self, name: &str, min: u32) -> Result<u32, Error> {
        let value: u32 = self.get(name)?;
        if value < min {
            return Err(Error::bad_request(format!(
                "option `{name}` must be at least {min}"
            )));
        }
        Ok(value)
    }

    /// The table's entry for `name`; a name missing from it is the adapter's own bug.
    fn spec(&self, name: &str) -> &'static Spec {
        self.table
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("option `{name}` is not in the adapter's table"))
    }
}

/// The `describe` rows of an option table: `options: option_infos!(OPTIONS)`, with the
/// adapter's generated `OptionInfo` in scope.
#[macro_export]
macro_rules! option_infos {
    ($table:expr) => {
        $table
            .iter()
            .map(|spec| OptionInfo {
                name: spec.name.to_string(),
                default_value: spec.default.to_string(),
                doc: spec.doc.to_string(),
            })
            .collect()
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &[Spec] = &[
        Spec {
            name: "a",
            default: "7",
            doc: "a number",
        },
        Spec {
            name: "b",
            default: "",
            doc: "text, none by default",
        },
    ];

    fn given(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_come_from_the_table() {
        let options = Options::new(TABLE, Vec::new()).unwrap();
        assert_eq!(options.get::<u32>("a").unwrap(), 7);
        assert_eq!(options.text("b"), None);
        let options = Options::new(TABLE, given(&[("a", " 9 "), ("b", "x")])).unwrap();
        assert_eq!(options.at_least("a", 9).unwrap(), 9);
        assert_eq!(options.text("b").as_deref(), Some("x"));
    }

    #[test]
    fn unknown_twice_and_bad_values_are_bad_requests() {
        let message = |r: Result<Options, Error>| match r {
            Err(Error::BadRequest(m)) => m,
            _ => panic!("expected a bad request"),
        };
        assert!(message(Options::new(TABLE, given(&[("c", "1")]))).contains("takes: a, b"));
        assert!(message(Options::new(TABLE, given(&[("a", "1"), ("a", "2")]))).contains("twice"));
        let options = Options::new(TABLE, given(&[("a", "x")])).unwrap();
        assert!(matches!(options.get::<u32>("a"), Err(Error::BadRequest(_))));
        let options = Options::new(TABLE, given(&[("a", "3")])).unwrap();
        assert!(matches!(
            options.at_least("a", 5),
            Err(Error::BadRequest(_))
        ));
    }
}
