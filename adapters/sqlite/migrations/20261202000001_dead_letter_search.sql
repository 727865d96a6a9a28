-- An operator's console finds dead letters by job id or correlation id, whatever their
-- status: the partial `dead_letters_pending_job` index serves only pending letters.
create index if not exists dead_letters_job_id on dead_letters (job_id);
create index if not exists dead_letters_correlation_id on dead_letters (correlation_id);
