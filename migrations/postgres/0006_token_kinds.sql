-- Per-kind token counts of each request (issue 20): the parts of input_tokens and
-- output_tokens priced apart (pricing::Usage::parts), and the web-search calls billed per call.
ALTER TABLE requests ADD COLUMN cached_input_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN cache_write_5m_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN cache_write_1h_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN reasoning_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN audio_input_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN audio_output_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN image_input_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN image_output_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN web_search_calls BIGINT NOT NULL DEFAULT 0;
