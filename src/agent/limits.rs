//! The run's allowance for the agent: requests, tokens and estimated cost, counted
//! from the ledger (so a resumed run continues the same count). A request is sent only
//! when even its largest possible reply stays within every limit.


use crate::spec::agent::AgentSection;

pub use crate::spec::agent::Usage;

impl Usage {
    pub fn tokens(&self) -> u64 {
        self.prompt_tokens + self.completion_tokens
    }

    /// None when a request of about `prompt_chars` characters may be sent; else why not.
    pub fn refuse(&self, cfg: &AgentSection, prompt_chars: usize) -> Option<String> {
        if self.requests >= cfg.max_requests as u64 {
            return Some(format!("agent.max_requests reached ({} of {})", self.requests, cfg.max_requests));
        }
        // A token is about 4 characters; the reply may use all of max_tokens per choice.
        let prompt = (prompt_chars as u64).div_ceil(4);
        let reply = cfg.max_tokens as u64 * cfg.proposals_per_request as u64;
        let worst_tokens = self.tokens() + prompt + reply;
        if worst_tokens > cfg.max_total_tokens {
            return Some(format!(
                "agent.max_total_tokens: {} used, and the next request may take up to {} more (limit {})",
                self.tokens(),
                prompt + reply,
                cfg.max_total_tokens
            ));
        }
        let worst_cost = self.cost_usd + cfg.cost(prompt, reply);
        if worst_cost > cfg.max_cost_usd {
            return Some(format!(
                "agent.max_cost_usd: ${:.4} used, and the next request may cost up to ${:.4} more (limit ${:.2})",
                self.cost_usd,
                worst_cost - self.cost_usd,
                cfg.max_cost_usd
            ));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_limit_refuses_the_next_request() {
        let cfg = AgentSection { max_requests: 2, max_total_tokens: 10_000, max_tokens: 1000, max_cost_usd: 1.0, usd_per_mtok_completion: 100.0, ..Default::default() };
        let mut u = Usage::default();
        assert_eq!(u.refuse(&cfg, 4000), None);
        u.requests = 2;
        assert!(u.refuse(&cfg, 4000).unwrap().contains("max_requests"));
        u.requests = 1;
        u.prompt_tokens = 8_500;
        assert!(u.refuse(&cfg, 4000).unwrap().contains("max_total_tokens"));
        u.prompt_tokens = 0;
        u.cost_usd = 0.95;
        assert!(u.refuse(&cfg, 4000).unwrap().contains("max_cost_usd"));
    }
}
