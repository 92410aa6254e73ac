//! Code frontend text -> IR: a hand-written recursive-descent parser over the sanitised text,
//! with byte spans on every error.
//!
//! It reads everything the reference reads correctly, the same way, and on top of that the
//! quoted strings and keyed constraints the writer uses for values the reference cannot carry,
//! `else` without a colon (the draft's printed form), `if ... then ...` (draft -00), `;`
//! without a following space or a newline between calls, and `->` sequencing (draft A.5).

use super::lexical::*;
use crate::silp::error::{ErrorCode, SilpError};
use crate::silp::ir::{Alternative, Constraint, Entity, Extras, Text, is_action_code};
use crate::silp::sanitize::{self, Notice};
use serde_json::Value;
use std::ops::Range;

/// What the parser found, before the caller adds `meta`.
#[derive(Debug)]
pub(crate) struct Parsed {
    pub intent: Text,
    pub entities: Vec<Entity>,
    pub constraints: Vec<Constraint>,
    pub alternatives: Vec<Alternative>,
    /// True when calls were chained with `->`.
    pub sequential: bool,
    /// Byte offset (in the parsed text) of the `else` keyword, when there is an else branch.
    pub else_at: Option<usize>,
}

/// One argument of a call.
enum Argument {
    Positional(Text),
    Keyword(Text, Text),
}

struct Call {
    verb: Text,
    arguments: Vec<Argument>,
}

/// Parses `text` (already stripped of invisible characters). Identifier mappings are reported
/// into `notices` with offsets in `text`.
pub(crate) fn parse(text: &str, notices: &mut Vec<Notice>) -> Result<Parsed, SilpError> {
    let mut p = Parser { src: text, pos: 0, notices };
    p.payload()
}

struct Parser<'a, 'n> {
    src: &'a str,
    pos: usize,
    notices: &'n mut Vec<Notice>,
}

impl Parser<'_, '_> {
    fn payload(&mut self) -> Result<Parsed, SilpError> {
        self.skip_ws();
        if self.at_end() {
            return Err(SilpError::syntax(
                0..self.src.len(),
                "empty payload: expected a function call such as 'cancel(flight)'",
            ));
        }
        let mut constraints = Vec::new();
        if self.keyword_then_space("if") {
            self.skip_ws();
            constraints = self.condition()?;
        }
        let (calls, sequential) = self.actions()?;
        self.skip_ws();
        while self.keyword_then_space("with") {
            self.skip_ws();
            constraints.push(self.constraint(true)?);
            self.skip_ws();
        }
        let mut alternatives = Vec::new();
        let mut else_at = None;
        if self.at_keyword("else") && matches!(self.peek_at(4), Some(':') | Some(' ' | '\t' | '\n' | '\r')) {
            else_at = Some(self.pos);
            self.pos += 4;
            self.eat(':');
            if !self.skip_ws() {
                return Err(self.error_here("expected a space after 'else'"));
            }
            alternatives = self.alternatives()?;
        }
        self.skip_ws();
        if !self.at_end() {
            return Err(SilpError::syntax(
                self.pos..self.src.len(),
                format!("unexpected text after the payload: '{}'", self.rest_preview()),
            ));
        }
        let mut calls = calls.into_iter();
        let first = calls.next().expect("actions() returns at least one call");
        let intent = first.verb.clone();
        let mut entities = Vec::new();
        for call in std::iter::once(first).chain(calls) {
            let is_primary = call.verb == intent;
            if call.arguments.is_empty() && !is_primary {
                // A bare step such as `process` in `fetch(x) -> process -> email(y)`: keep it.
                entities.push(entity("act", Text::default(), &call.verb));
            }
            for argument in call.arguments {
                entities.push(match argument {
                    Argument::Positional(value) => entity("act", value, &call.verb),
                    Argument::Keyword(key, value) => entity(&key, value, &call.verb),
                });
            }
        }
        Ok(Parsed { intent, entities, constraints, alternatives, sequential, else_at })
    }

    // ---- condition -------------------------------------------------------------------------

    fn condition(&mut self) -> Result<Vec<Constraint>, SilpError> {
        let mut constraints = vec![self.constraint(false)?];
        loop {
            let before_space = self.pos;
            let spaced = self.skip_ws();
            if self.eat(':') {
                if !self.skip_ws() && !self.at_end() {
                    return Err(self.error_here("expected a space after ':' that ends the condition"));
                }
                return Ok(constraints);
            }
            if spaced && self.keyword_then_space("and") {
                self.skip_ws();
                constraints.push(self.constraint(false)?);
                continue;
            }
            if spaced && self.keyword_then_space("then") {
                self.skip_ws();
                return Ok(constraints);
            }
            self.pos = before_space;
            return Err(self.error_here("expected ' and ', ': ' or ' then ' after the constraint"));
        }
    }

    /// One constraint. `flag_allowed`: a bare name is a constraint with an empty value, as in
    /// `... with timeout`.
    fn constraint(&mut self, flag_allowed: bool) -> Result<Constraint, SilpError> {
        let start = self.pos;
        let kind = if self.peek() == Some('"') {
            let kind = self.quoted()?;
            if self.peek() != Some('(') {
                return Err(self.error_here("expected '(' after a quoted constraint type"));
            }
            kind
        } else {
            let negated = self.eat('!');
            let name = self.name("a constraint type")?;
            if negated { compact_str::format_compact!("!{name}") } else { name }
        };
        match self.peek() {
            Some('(') => {
                self.pos += 1;
                self.constraint_arguments(kind, start)
            }
            Some(c) if OPERATOR_CHARS.contains(&c) => self.infix_constraint(kind),
            _ if kind.starts_with('!') => Ok(Constraint::new(kind, "true")),
            _ if flag_allowed => Ok(Constraint::new(kind, "")),
            _ => Err(SilpError::syntax(
                start..self.word_end(),
                format!(
                    "cannot parse constraint '{}': expected '(' or a comparison operator after '{kind}'",
                    self.word_preview(start)
                ),
            )),
        }
    }

    /// `type<op>value[, time]`.
    fn infix_constraint(&mut self, kind: Text) -> Result<Constraint, SilpError> {
        let op_start = self.pos;
        while self.peek().is_some_and(|c| OPERATOR_CHARS.contains(&c)) {
            self.pos += 1;
        }
        let op = self.src[op_start..self.pos].to_owned();
        let value = self.word_value("a value after the operator")?;
        let mut c = Constraint::new(kind, value);
        if self.eat(',') {
            self.skip_ws();
            c.time = Some(self.word_value("a time after ','")?);
        }
        c.extra.insert("operator".to_owned(), Value::String(op));
        Ok(c)
    }

    /// A value in infix form: quoted, or a bare word ending at whitespace, ',' or a ':' that
    /// ends the condition.
    fn word_value(&mut self, what: &str) -> Result<Text, SilpError> {
        if self.peek() == Some('"') {
            return self.quoted();
        }
        let start = self.pos;
        while let Some(c) = self.peek() {
            let ends_condition = c == ':' && self.peek_at(1).is_none_or(char::is_whitespace);
            if c.is_whitespace() || c == ',' || ends_condition {
                break;
            }
            self.pos += c.len_utf8();
        }
        if self.pos == start {
            return Err(self.error_here(&format!("expected {what}")));
        }
        Ok(Text::from(&self.src[start..self.pos]))
    }

    /// The arguments of `type(...)` or `!type(...)`, just after the '('.
    fn constraint_arguments(&mut self, kind: Text, start: usize) -> Result<Constraint, SilpError> {
        self.skip_ws();
        if self.starts_constraint_key() {
            return self.keyed_constraint(kind, start);
        }
        let mut args = Vec::new();
        while let Some(a) = self.argument_value(&[','], start)? {
            args.push(a);
            if !self.eat(',') {
                break;
            }
        }
        self.close(start)?;
        let span = start..self.pos;
        let text = &self.src[span.clone()];
        if let Some(name) = kind.strip_prefix('!') {
            let mut c = Constraint::new(kind.clone(), "true");
            match args.len() {
                1 => c.time = args.pop(),
                0 => {
                    return Err(SilpError::syntax(
                        span,
                        format!(
                            "cannot parse constraint '{text}': '!{name}()' needs a time inside the parentheses, or none at all"
                        ),
                    ));
                }
                _ => {
                    return Err(SilpError::syntax(
                        span,
                        format!("cannot parse constraint '{text}': a negation takes one argument, the time"),
                    ));
                }
            }
            return Ok(c);
        }
        let is_time = |s: &str| s.starts_with("t+") || s.starts_with("t-");
        let (subject, value, time) = match args.len() {
            0 => (None, Text::default(), None),
            1 => (None, args.pop().unwrap_or_default(), None),
            2 if is_time(&args[1]) => {
                let time = args.pop();
                (None, args.pop().unwrap_or_default(), time)
            }
            2 => {
                let value = args.pop().unwrap_or_default();
                (args.pop(), value, None)
            }
            3 => {
                let time = args.pop();
                let value = args.pop().unwrap_or_default();
                (args.pop(), value, time)
            }
            n => {
                return Err(SilpError::syntax(
                    span,
                    format!(
                        "cannot parse constraint '{text}': {n} arguments; expected at most subject, value and time"
                    ),
                ));
            }
        };
        let mut c = Constraint::new(kind, value);
        c.time = time;
        if let Some(s) = subject {
            c.extra.insert("subject".to_owned(), Value::String(s.into()));
        }
        Ok(c)
    }

    fn starts_constraint_key(&self) -> bool {
        looks_like_constraint_key(&self.src[self.pos..])
    }

    /// `type(value=..,subject=..,time=..,op=..)`.
    fn keyed_constraint(&mut self, kind: Text, start: usize) -> Result<Constraint, SilpError> {
        let mut fields: [Option<Text>; 4] = Default::default();
        loop {
            self.skip_ws();
            let key_start = self.pos;
            let Some(index) = CONSTRAINT_KEYS
                .iter()
                .position(|k| self.src[self.pos..].strip_prefix(k).is_some_and(|r| r.starts_with('=')))
            else {
                return Err(self.error_here(
                    "expected one of value=, subject=, time=, op= (this constraint uses named fields)",
                ));
            };
            self.pos += CONSTRAINT_KEYS[index].len() + 1;
            let value = self.argument_value(&[','], start)?.unwrap_or_default();
            if fields[index].replace(value).is_some() {
                return Err(SilpError::syntax(
                    key_start..self.pos,
                    format!("'{}=' is given twice", CONSTRAINT_KEYS[index]),
                ));
            }
            if !self.eat(',') {
                break;
            }
        }
        self.close(start)?;
        let [value, subject, time, op] = fields;
        let Some(value) = value else {
            return Err(SilpError::syntax(start..self.pos, "a constraint with named fields needs 'value='"));
        };
        let mut c = Constraint::new(kind, value);
        c.time = time;
        if let Some(s) = subject {
            c.extra.insert("subject".to_owned(), Value::String(s.into()));
        }
        if let Some(op) = op {
            c.extra.insert("operator".to_owned(), Value::String(op.into()));
        }
        Ok(c)
    }

    // ---- actions ---------------------------------------------------------------------------

    /// Calls separated by `;`, a newline or `->`.
    fn actions(&mut self) -> Result<(Vec<Call>, bool), SilpError> {
        let mut sequential = false;
        let mut calls = vec![self.call(false)?];
        loop {
            let before = self.pos;
            let spaced_with_newline = {
                let ws_start = self.pos;
                self.skip_ws();
                self.src[ws_start..self.pos].contains('\n')
            };
            if self.eat(';') {
                self.skip_ws();
                calls.push(self.call(false)?);
            } else if self.src[self.pos..].starts_with("->") {
                self.pos += 2;
                self.skip_ws();
                sequential = true;
                calls.push(self.call(true)?);
            } else if spaced_with_newline
                && self.peek().is_some_and(is_word_char)
                && !self.at_keyword("else")
                && !self.at_keyword("with")
            {
                calls.push(self.call(false)?);
            } else {
                self.pos = before;
                return Ok((calls, sequential));
            }
        }
    }

    /// `name(args)`; in a `->` chain the parentheses may be left out.
    fn call(&mut self, in_chain: bool) -> Result<Call, SilpError> {
        let start = self.pos;
        let verb = self.verb()?;
        if self.peek() != Some('(') {
            let rest = self.src[self.pos..].trim_start();
            if in_chain || rest.starts_with("->") {
                return Ok(Call { verb, arguments: Vec::new() });
            }
            return Err(SilpError::syntax(
                start..self.word_end().max(self.char_end(self.pos)),
                format!(
                    "cannot parse function call '{}': expected '(' after the function name",
                    self.word_preview(start)
                ),
            ));
        }
        self.pos += 1;
        let mut arguments = Vec::new();
        loop {
            self.skip_ws();
            if let Some(a) = self.call_argument(start)? {
                arguments.push(a);
            }
            if !self.eat(',') {
                break;
            }
        }
        self.close(start)?;
        Ok(Call { verb, arguments })
    }

    /// One argument: `value`, `"value"`, `key=value`, `"key"=value`; `None` for an empty one.
    fn call_argument(&mut self, call_start: usize) -> Result<Option<Argument>, SilpError> {
        if self.peek() == Some('"') {
            let s = self.quoted()?;
            self.skip_ws();
            if self.eat('=') {
                let value = self.argument_value(&[','], call_start)?.unwrap_or_default();
                return Ok(Some(Argument::Keyword(s, value)));
            }
            return Ok(Some(Argument::Positional(s)));
        }
        let arg_start = self.pos;
        let name_len: usize =
            self.src[self.pos..].chars().take_while(|c| is_word_char(*c)).map(char::len_utf8).sum();
        if name_len > 0 && self.src[self.pos + name_len..].starts_with('=') {
            let key_span = arg_start..arg_start + name_len;
            self.pos += name_len + 1;
            match self.argument_value(&[','], call_start)? {
                Some(value) => {
                    let key = self.identifier(key_span, "keyword")?;
                    return Ok(Some(Argument::Keyword(key, value)));
                }
                // `k=` with nothing after it is the positional value "k=", as in the reference.
                None => {
                    return Ok(Some(Argument::Positional(Text::from(self.src[arg_start..self.pos].trim()))));
                }
            }
        }
        Ok(self.argument_value(&[','], call_start)?.map(Argument::Positional))
    }

    /// A quoted string, or bare text up to a `stops` character or the closing ')' at depth 0,
    /// trimmed. `None` for empty bare text.
    fn argument_value(&mut self, stops: &[char], call_start: usize) -> Result<Option<Text>, SilpError> {
        self.skip_ws();
        if self.peek() == Some('"') {
            let s = self.quoted()?;
            self.skip_ws();
            return Ok(Some(s));
        }
        let start = self.pos;
        let mut depth = 0usize;
        while let Some(c) = self.peek() {
            match c {
                '(' => depth += 1,
                ')' if depth == 0 => break,
                ')' => depth -= 1,
                c if depth == 0 && stops.contains(&c) => break,
                _ => {}
            }
            self.pos += c.len_utf8();
        }
        if self.at_end() {
            return Err(SilpError::syntax(
                call_start..self.src.len(),
                format!("unclosed '(' in '{}': expected ')'", self.preview(call_start)),
            ));
        }
        let text = self.src[start..self.pos].trim();
        Ok((!text.is_empty()).then(|| Text::from(text)))
    }

    fn close(&mut self, call_start: usize) -> Result<(), SilpError> {
        self.skip_ws();
        if self.eat(')') {
            return Ok(());
        }
        if self.at_end() {
            return Err(SilpError::syntax(
                call_start..self.src.len(),
                format!("unclosed '(' in '{}': expected ')'", self.preview(call_start)),
            ));
        }
        Err(self.error_here("expected ',' or ')'"))
    }

    // ---- alternatives ----------------------------------------------------------------------

    fn alternatives(&mut self) -> Result<Vec<Alternative>, SilpError> {
        let mut alternatives = vec![self.alternative()?];
        loop {
            let before = self.pos;
            self.skip_ws();
            if self.eat(';') {
                self.skip_ws();
                alternatives.push(self.alternative()?);
            } else {
                self.pos = before;
                return Ok(alternatives);
            }
        }
    }

    /// `name()`, `name(target)`, `name(target@location)`, `name(loc=location)`.
    fn alternative(&mut self) -> Result<Alternative, SilpError> {
        let start = self.pos;
        let action = self.verb()?;
        if !self.eat('(') {
            return Err(SilpError::syntax(
                start..self.word_end().max(self.char_end(start)),
                format!(
                    "cannot parse alternative '{}': expected '(' after the function name",
                    self.word_preview(start)
                ),
            ));
        }
        let mut alt = Alternative { action, target: None, location: None, extra: Extras::new() };
        loop {
            self.skip_ws();
            if self.src[self.pos..].starts_with("loc=") {
                self.pos += 4;
                alt.location = Some(self.argument_value(&[','], start)?.unwrap_or_default());
            } else if let Some(target) = self.argument_value(&[',', '@'], start)? {
                alt.target = Some(target);
                if self.eat('@') {
                    let at = self.pos - 1;
                    match self.argument_value(&[','], start)? {
                        Some(location) => alt.location = Some(location),
                        None => return Err(SilpError::syntax(at..self.pos, "expected a location after '@'")),
                    }
                }
            } else if self.peek() == Some('@') {
                return Err(self.error_here("expected a target before '@'"));
            }
            if !self.eat(',') {
                break;
            }
        }
        self.close(start)?;
        Ok(alt)
    }

    // ---- names -----------------------------------------------------------------------------

    /// A function name read as an action code: `cancel` -> `!CANCEL`.
    fn verb(&mut self) -> Result<Text, SilpError> {
        let start = self.pos;
        let name = self.name("a function name")?;
        let mut verb = Text::with_capacity(name.len() + 1);
        verb.push('!');
        verb.push_str(&name);
        verb.make_ascii_uppercase();
        if !is_action_code(&verb) {
            return Err(SilpError::at(
                ErrorCode::DecodeFailed,
                start..self.pos,
                format!(
                    "invalid action code '{verb}': function names are letters and underscores, starting with a letter"
                ),
            ));
        }
        Ok(verb)
    }

    /// A run of word characters, mapped to ASCII.
    fn name(&mut self, what: &str) -> Result<Text, SilpError> {
        let start = self.pos;
        while let Some(c) = self.peek().filter(|c| is_word_char(*c)) {
            self.pos += c.len_utf8();
        }
        if self.pos == start {
            let found = self.peek().map_or("the end of the payload".to_owned(), |c| format!("'{c}'"));
            return Err(SilpError::syntax(
                start..self.char_end(start),
                format!("expected {what}, found {found}"),
            ));
        }
        self.identifier(start..self.pos, what)
    }

    /// The ASCII reading of the identifier at `span`, reporting any mapping.
    fn identifier(&mut self, span: Range<usize>, what: &str) -> Result<Text, SilpError> {
        let raw = &self.src[span.clone()];
        match sanitize::ascii_identifier(raw) {
            Ok(ascii) => {
                if ascii != raw {
                    self.notices.push(Notice::HomoglyphMapped {
                        from: raw.to_owned(),
                        to: ascii.to_string(),
                        offset: span.start,
                    });
                }
                Ok(Text::from(ascii.as_ref()))
            }
            Err(c) => Err(SilpError::syntax(
                span,
                format!(
                    "{what} '{raw}' has the non-ASCII character '{c}' (U+{:04X}); names must be ASCII, values may be quoted",
                    c as u32
                ),
            )),
        }
    }

    fn quoted(&mut self) -> Result<Text, SilpError> {
        let (s, end) = read_quoted(self.src, self.pos)?;
        self.pos = end;
        Ok(Text::from(s))
    }

    // ---- cursor ----------------------------------------------------------------------------

    fn peek(&self) -> Option<char> {
        self.src[self.pos..].chars().next()
    }

    fn peek_at(&self, bytes: usize) -> Option<char> {
        self.src.get(self.pos + bytes..).and_then(|s| s.chars().next())
    }

    fn at_end(&self) -> bool {
        self.pos >= self.src.len()
    }

    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.pos += c.len_utf8();
            true
        } else {
            false
        }
    }

    /// Skips whitespace; true when there was some.
    fn skip_ws(&mut self) -> bool {
        let start = self.pos;
        while let Some(c) = self.peek().filter(|c| c.is_whitespace()) {
            self.pos += c.len_utf8();
        }
        self.pos > start
    }

    /// True when `word` starts here and is not followed by a word character.
    fn at_keyword(&self, word: &str) -> bool {
        self.src[self.pos..].starts_with(word) && !self.peek_at(word.len()).is_some_and(is_word_char)
    }

    /// Consumes `word` when it is followed by whitespace.
    fn keyword_then_space(&mut self, word: &str) -> bool {
        if self.src[self.pos..].starts_with(word) && self.peek_at(word.len()).is_some_and(char::is_whitespace)
        {
            self.pos += word.len();
            true
        } else {
            false
        }
    }

    fn word_end(&self) -> usize {
        self.pos + self.src[self.pos..].find(char::is_whitespace).unwrap_or(self.src.len() - self.pos)
    }

    fn word_preview(&self, start: usize) -> &str {
        let end = start + self.src[start..].find(char::is_whitespace).unwrap_or(self.src.len() - start);
        &self.src[start..end]
    }

    fn preview(&self, start: usize) -> String {
        self.src[start..].chars().take(60).collect()
    }

    fn rest_preview(&self) -> String {
        self.preview(self.pos)
    }

    /// The end of the character at `at` (`at` itself at the end): a span never splits a char.
    fn char_end(&self, at: usize) -> usize {
        self.src[at..].chars().next().map_or(at, |c| at + c.len_utf8())
    }

    fn error_here(&self, message: &str) -> SilpError {
        let end = self.char_end(self.pos);
        let found = self.peek().map_or("the end of the payload".to_owned(), |c| format!("'{c}'"));
        SilpError::syntax(self.pos..end, format!("{message}, found {found}"))
    }
}

fn entity(id: &str, value: Text, action: &Text) -> Entity {
    Entity { id: Text::from(id), value, action: Some(action.clone()), extra: Extras::new() }
}
