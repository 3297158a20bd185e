//! What the producer produces: a record's topic, key, value and headers.

/// The most headers a record carries.
const MAX_HEADERS: usize = 24;

/// A record's headers, in order: their values end to end in one buffer, so a record's dozen
/// headers cost one allocation instead of one each (the producer copies them anyway). Values are
/// bytes: the CloudEvents attributes are text, a schema registry's ids binary.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Headers {
    values: Vec<u8>,
    /// Each header's name and where its value ends in `values`.
    ends: [(&'static str, u32); MAX_HEADERS],
    len: usize,
}

impl Headers {
    /// Headers with room for `bytes` of values.
    pub fn with_capacity(bytes: usize) -> Self {
        Self {
            values: Vec::with_capacity(bytes),
            ..Self::default()
        }
    }

    /// Appends `name` with the value `parts` make, end to end.
    pub fn push(&mut self, name: &'static str, parts: &[&str]) {
        assert!(self.len < MAX_HEADERS, "at most {MAX_HEADERS} headers");
        for part in parts {
            self.values.extend_from_slice(part.as_bytes());
        }
        self.end(name);
    }

    /// Appends `name` with a binary value.
    pub fn push_bytes(&mut self, name: &'static str, value: &[u8]) {
        assert!(self.len < MAX_HEADERS, "at most {MAX_HEADERS} headers");
        self.values.extend_from_slice(value);
        self.end(name);
    }

    fn end(&mut self, name: &'static str) {
        let end = u32::try_from(self.values.len()).expect("headers under 4 GiB");
        self.ends[self.len] = (name, end);
        self.len += 1;
    }

    /// How many headers there are (at most 24).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no headers (a tombstone's, a membership record's).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Each header's name and value, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &[u8])> + '_ {
        let mut start = 0;
        self.ends[..self.len].iter().map(move |&(name, end)| {
            let value = &self.values[start..end as usize];
            start = end as usize;
            (name, value)
        })
    }

    /// The value of `name`, when it is text.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.get_bytes(name)
            .and_then(|v| std::str::from_utf8(v).ok())
    }

    /// The value of `name`, as bytes.
    pub fn get_bytes(&self, name: &str) -> Option<&[u8]> {
        self.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }
}

/// A Kafka record, ready to produce.
#[derive(Debug, Clone)]
pub struct Record {
    /// The topic, already rendered for the stream.
    pub topic: String,
    /// The Kafka key: the object's, rendered by its channel's key template, or a membership key.
    pub key: String,
    /// The envelope's (or membership entry's) JSON; empty for a tombstone.
    pub value: Vec<u8>,
    /// The record's headers (the envelope's CloudEvents `ce_*` attributes among them).
    pub headers: Headers,
    /// A tombstone: the key with a null value (`value` is empty and not sent).
    pub tombstone: bool,
    /// The partition it must go to; `None`: the key's (the partitioner hashes it).
    pub partition: Option<i32>,
}

impl Record {
    /// What the record takes in a producer's queue, as librdkafka counts it: its key and value.
    pub fn size(&self) -> usize {
        self.key.len() + self.value.len()
    }

    /// The tombstone following this record: its topic and key with a null value, so a
    /// compacted topic forgets the key.
    pub fn tombstone(&self) -> Record {
        Record {
            topic: self.topic.clone(),
            key: self.key.clone(),
            value: Vec::new(),
            headers: Headers::default(),
            tombstone: true,
            partition: None,
        }
    }
}
