//! The turns of a replica's checkpoint writers ([`Pacer`]), shared by every term.

use std::time::Duration;

/// The least time between two paced ConfigMap operations (a checkpoint write, a look for
/// resync requests) of the writers of one replica, together.
pub const PACE: Duration = Duration::from_millis(250);

/// Spaces the ConfigMap operations of every checkpoint writer of a replica by [`PACE`]: a
/// replica owning dozens of shards, each writing its own ConfigMap every `intervalMs` while
/// its positions move, would otherwise cost the API server a read and a replace per shard and
/// interval. With many shards each is written less often (every `PACE` times the shards with
/// something to write); a single leader's writer, alone, is never held up. The last write of a
/// term is not paced, nor the writes its streams wait for in its first seconds (their new eras,
/// with each claim): paced, the streams of shards claimed together would start one turn
/// apart.
#[derive(Debug)]
pub struct Pacer {
    next: tokio::sync::Mutex<tokio::time::Instant>,
}

impl Default for Pacer {
    fn default() -> Self {
        Self {
            next: tokio::sync::Mutex::new(tokio::time::Instant::now()),
        }
    }
}

impl Pacer {
    /// Waits for this writer's turn.
    pub async fn turn(&self) {
        let mut next = self.next.lock().await;
        tokio::time::sleep_until(*next).await;
        *next = tokio::time::Instant::now() + PACE;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// Ten writers asking at once get their turns one [`PACE`] apart, in the order they asked;
    /// a writer alone later is not held up.
    #[tokio::test(start_paused = true)]
    async fn turns_are_spaced_whoever_takes_them() {
        let pacer = Arc::new(Pacer::default());
        let start = tokio::time::Instant::now();
        let turns = (0..10).map(|_| {
            let pacer = pacer.clone();
            async move {
                pacer.turn().await;
                start.elapsed()
            }
        });
        let at = futures::future::join_all(turns).await;
        let expected: Vec<Duration> = (0..10).map(|i| PACE * i).collect();
        assert_eq!(at, expected);
        tokio::time::sleep(Duration::from_secs(5)).await;
        let alone = tokio::time::Instant::now();
        pacer.turn().await;
        assert_eq!(alone.elapsed(), Duration::ZERO);
    }
}
