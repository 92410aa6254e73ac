//! Server-sent events read from an agent's HTTP response, one at a time as they arrive, each
//! held to a size bound: an agent's stream is read no further than one event past the bound,
//! however long it runs or however large an event it sends. Only `data` matters to silpgate:
//! an event's `data:` lines, joined by newlines; comments and other fields are passed over.

/// Why the next event could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EventError {
    #[error("an event is larger than the limit of {0} bytes")]
    TooLarge(usize),
    #[error("the stream broke: {0}")]
    Read(#[from] reqwest::Error),
}

/// The events of one response.
pub(crate) struct Events {
    response: reqwest::Response,
    /// Bytes received and not yet read as whole lines.
    pending: Vec<u8>,
    /// The `data` of the event being read.
    data: Option<String>,
    limit: usize,
    ended: bool,
}

impl Events {
    /// Reads `response` as events of at most `limit` bytes each.
    pub(crate) fn new(response: reqwest::Response, limit: usize) -> Events {
        Events { response, pending: Vec::new(), data: None, limit, ended: false }
    }

    /// The next event's data, or `None` once the stream has ended.
    pub(crate) async fn next(&mut self) -> Result<Option<String>, EventError> {
        loop {
            while let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
                let mut line: Vec<u8> = self.pending.drain(..=end).collect();
                line.pop();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                if line.is_empty() {
                    if let Some(data) = self.data.take() {
                        return Ok(Some(data));
                    }
                    continue;
                }
                self.read_line(&line);
            }
            let held = self.pending.len() + self.data.as_ref().map_or(0, String::len);
            if held > self.limit {
                return Err(EventError::TooLarge(self.limit));
            }
            if self.ended {
                // A last event without its blank line still counts: the stream's end ends it.
                return Ok(self.data.take());
            }
            match self.response.chunk().await? {
                Some(chunk) => self.pending.extend_from_slice(&chunk),
                None => {
                    self.ended = true;
                    if !self.pending.is_empty() {
                        self.pending.push(b'\n');
                    }
                }
            }
        }
    }

    fn read_line(&mut self, line: &[u8]) {
        let line = String::from_utf8_lossy(line);
        let Some(value) = line.strip_prefix("data") else {
            return;
        };
        let value = match value.strip_prefix(':') {
            Some(value) => value.strip_prefix(' ').unwrap_or(value),
            None if value.is_empty() => "",
            // A field whose name only starts with "data".
            None => return,
        };
        match &mut self.data {
            Some(data) => {
                data.push('\n');
                data.push_str(value);
            }
            None => self.data = Some(value.to_owned()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(chunks: &[&'static str]) -> reqwest::Response {
        let chunks: Vec<Result<&'static str, std::io::Error>> = chunks.iter().map(|c| Ok(*c)).collect();
        let body = reqwest::Body::wrap_stream(futures_util::stream::iter(chunks));
        reqwest::Response::from(axum::http::Response::new(body))
    }

    async fn all(chunks: &[&'static str], limit: usize) -> Result<Vec<String>, EventError> {
        let mut events = Events::new(response(chunks), limit);
        let mut read = Vec::new();
        while let Some(data) = events.next().await? {
            read.push(data);
        }
        Ok(read)
    }

    #[tokio::test]
    async fn events_are_read_whole_across_chunks_and_line_ends() {
        let read = all(
            &["data: {\"a\"", ":1}\n\n: a comment\r\nid: 7\r\n", "data:x\r\ndata: y\r\n\r\n", "data: last"],
            100,
        );
        assert_eq!(read.await.unwrap(), ["{\"a\":1}", "x\ny", "last"]);
        assert_eq!(all(&["event: ping\n\n", "\n\n"], 100).await.unwrap(), Vec::<String>::new());
        assert_eq!(all(&["datafield: no\n\ndata\n\n"], 100).await.unwrap(), [""]);
    }

    #[tokio::test]
    async fn an_event_past_the_limit_is_refused_before_it_ends() {
        let large = all(&["data: 0123456789", "0123456789", "0123456789"], 16).await;
        assert!(matches!(large, Err(EventError::TooLarge(16))), "{large:?}");
        let many_small = all(&["data: 0123456789\n\n"; 10], 16).await.unwrap();
        assert_eq!(many_small.len(), 10);
    }
}
