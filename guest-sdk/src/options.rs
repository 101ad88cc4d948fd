//! Typed reading of the `init` options, with a clear `bad-request` for an unknown option or a
//! bad value.

use crate::Error;

/// The options `init` received, taken one by one; [`Options::finish`] rejects any left over.
pub struct Options {
    rest: Vec<(String, String)>,
}

impl Options {
    /// Wrap the options `init` received. A name given twice is a bad request.
    pub fn new(options: Vec<(String, String)>) -> Result<Self, Error> {
        for (i, (name, _)) in options.iter().enumerate() {
            if options[..i].iter().any(|(n, _)| n == name) {
                return Err(Error::bad_request(format!("option `{name}` given twice")));
            }
        }
        Ok(Self { rest: options })
    }

    /// Take option `name` as text.
    pub fn string(&mut self, name: &str) -> Option<String> {
        let i = self.rest.iter().position(|(n, _)| n == name)?;
        Some(self.rest.remove(i).1)
    }

    /// Take option `name` parsed as `T`, or `default` when absent.
    pub fn parse<T: std::str::FromStr>(&mut self, name: &str, default: T) -> Result<T, Error>
    where
        T::Err: std::fmt::Display,
    {
        match self.string(name) {
            None => Ok(default),
            Some(text) => text.trim().parse::<T>().map_err(|e| {
                Error::bad_request(format!("option `{name}`: cannot read `{text}`: {e}"))
            }),
        }
    }

    /// Fail with a bad request naming every option nobody took.
    pub fn finish(self) -> Result<(), Error> {
        if self.rest.is_empty() {
            return Ok(());
        }
        let names: Vec<&str> = self.rest.iter().map(|(n, _)| n.as_str()).collect();
        Err(Error::bad_request(format!(
            "unknown option(s): {}",
            names.join(", ")
        )))
    }
}
