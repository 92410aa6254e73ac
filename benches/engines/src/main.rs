//! Writes the AMQP relay's per-message state in silpgate's shapes on several engines and prints
//! the CPU and wall time per message. Each message: a ledger lookup (a miss), the ledger entry
//! (60 bytes) and its time index, its conversation's session record (150 bytes, 200
//! conversations), a compile.lock record (300 bytes, every message a new IR) and its index;
//! after each window of 64 messages, one atomic batch and one durable sync, then the window's
//! published marks (a ledger entry rewritten) go into the next window's batch.
//!
//! Engines: `sled-keys` (sled, every key in the window's batch: silpgate's store before the
//! journal), `sled-journal` (sled, the window as one journal record, every key once per 2 s
//! checkpoint: silpgate's store now), `fjall` (LSM, `PersistMode::SyncData` per window),
//! `redb` (B-tree, one write transaction per window).
//!
//! Usage: silpgate-bench-engines ENGINE DIR [MESSAGES=64000]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const WINDOW: u64 = 64;
const CONVERSATIONS: u64 = 200;

type Writes = BTreeMap<Vec<u8>, Vec<u8>>;

/// One engine: a lookup, and a window's writes made durable at once.
trait Engine {
    fn lookup(&self, key: &[u8]) -> Option<Vec<u8>>;
    fn commit(&mut self, writes: Writes);
    /// Whatever the engine still owes the disk at the end of the run (a checkpoint).
    fn finish(&mut self) {}
}

struct SledKeys(sled::Db);

impl Engine for SledKeys {
    fn lookup(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.0.get(key).unwrap().map(|v| v.to_vec())
    }
    fn commit(&mut self, writes: Writes) {
        let mut batch = sled::Batch::default();
        for (k, v) in writes {
            batch.insert(k, v);
        }
        self.0.apply_batch(batch).unwrap();
        self.0.flush().unwrap();
    }
}

/// The window as one record; every key once per checkpoint, the journal trimmed behind it.
struct SledJournal {
    db: sled::Db,
    journaled: Writes,
    records: Vec<u64>,
    next: u64,
    checkpointed: Instant,
}

impl Engine for SledJournal {
    fn lookup(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.journaled.get(key).cloned().or_else(|| self.db.get(key).unwrap().map(|v| v.to_vec()))
    }
    fn commit(&mut self, writes: Writes) {
        let mut record = Vec::new();
        for (k, v) in &writes {
            record.extend_from_slice(&(k.len() as u32).to_be_bytes());
            record.extend_from_slice(k);
            record.extend_from_slice(&(v.len() as u32).to_be_bytes());
            record.extend_from_slice(v);
        }
        let mut key = b"journal:".to_vec();
        key.extend_from_slice(&self.next.to_be_bytes());
        self.db.insert(key, record).unwrap();
        self.db.flush().unwrap();
        self.records.push(self.next);
        self.next += 1;
        self.journaled.extend(writes);
        if self.checkpointed.elapsed() >= Duration::from_secs(2) {
            self.finish();
        }
    }
    fn finish(&mut self) {
        for (k, v) in std::mem::take(&mut self.journaled) {
            self.db.insert(k, v).unwrap();
        }
        for seq in self.records.drain(..) {
            let mut key = b"journal:".to_vec();
            key.extend_from_slice(&seq.to_be_bytes());
            self.db.remove(key).unwrap();
        }
        self.db.flush().unwrap();
        self.checkpointed = Instant::now();
    }
}

struct Fjall {
    keyspace: fjall::Keyspace,
    partition: fjall::PartitionHandle,
}

impl Engine for Fjall {
    fn lookup(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.partition.get(key).unwrap().map(|v| v.to_vec())
    }
    fn commit(&mut self, writes: Writes) {
        let mut batch = self.keyspace.batch();
        for (k, v) in writes {
            batch.insert(&self.partition, k, v);
        }
        batch.commit().unwrap();
        self.keyspace.persist(fjall::PersistMode::SyncData).unwrap();
    }
}

const TABLE: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("state");

struct Redb(redb::Database);

impl Engine for Redb {
    fn lookup(&self, key: &[u8]) -> Option<Vec<u8>> {
        let read = self.0.begin_read().unwrap();
        let table = read.open_table(TABLE).unwrap();
        table.get(key).unwrap().map(|v| v.value().to_vec())
    }
    fn commit(&mut self, writes: Writes) {
        let txn = self.0.begin_write().unwrap();
        {
            let mut table = txn.open_table(TABLE).unwrap();
            for (k, v) in &writes {
                table.insert(k.as_slice(), v.as_slice()).unwrap();
            }
        }
        txn.commit().unwrap();
    }
}

fn open(engine: &str, dir: &std::path::Path) -> Box<dyn Engine> {
    match engine {
        "sled-keys" => Box::new(SledKeys(sled::open(dir).unwrap())),
        "sled-journal" => Box::new(SledJournal {
            db: sled::open(dir).unwrap(),
            journaled: Writes::new(),
            records: Vec::new(),
            next: 0,
            checkpointed: Instant::now(),
        }),
        "fjall" => {
            let keyspace = fjall::Config::new(dir).open().unwrap();
            let partition = keyspace.open_partition("state", fjall::PartitionCreateOptions::default()).unwrap();
            Box::new(Fjall { keyspace, partition })
        }
        "redb" => {
            std::fs::create_dir_all(dir).unwrap();
            let db = redb::Database::create(dir.join("state.redb")).unwrap();
            let txn = db.begin_write().unwrap();
            txn.open_table(TABLE).unwrap();
            txn.commit().unwrap();
            Box::new(Redb(db))
        }
        other => panic!("unknown engine {other}: sled-keys, sled-journal, fjall or redb"),
    }
}

/// User + system CPU seconds of this process.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap().split_whitespace().collect();
    (fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap()) / 100.0
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (engine, dir) = (args.get(1).expect("ENGINE"), std::path::PathBuf::from(args.get(2).expect("DIR")));
    let messages: u64 = args.get(3).map_or(64_000, |n| n.parse().expect("MESSAGES"));
    let _ = std::fs::remove_dir_all(&dir);
    let mut store = open(engine, &dir);
    let (start, cpu) = (Instant::now(), cpu_seconds());
    let mut window = Writes::new();
    let mut marks = Vec::new();
    for i in 0..messages {
        let ledger_key = format!("ledger:message-{i:012}").into_bytes();
        assert!(store.lookup(&ledger_key).is_none());
        window.insert(ledger_key.clone(), vec![b'p'; 60]);
        window.insert(format!("ledgert:{i:016}message-{i:012}").into_bytes(), Vec::new());
        window.insert(format!("session:conversation-{}", i % CONVERSATIONS).into_bytes(), vec![b's'; 150]);
        window.insert(format!("lock:{i:016}").into_bytes(), vec![b'r'; 300]);
        let ir_hash = (i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).rotate_left(17);
        window.insert(format!("lockx:code\0sha256:{ir_hash:064x}").into_bytes(), i.to_be_bytes().to_vec());
        marks.push(ledger_key);
        if (i + 1) % WINDOW == 0 || i + 1 == messages {
            store.commit(std::mem::take(&mut window));
            // The window's published marks ride in the next window's batch.
            for key in marks.drain(..) {
                window.insert(key, vec![b'd'; 60]);
            }
        }
    }
    store.commit(window);
    store.finish();
    let (wall, cpu) = (start.elapsed().as_secs_f64(), cpu_seconds() - cpu);
    let per = |s: f64| s * 1e6 / messages as f64;
    println!("{engine}: {messages} messages, cpu {:.1} us/msg, wall {:.1} us/msg", per(cpu), per(wall));
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}
