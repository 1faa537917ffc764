-- Bookclub: the reading-group service.
-- Copyright 2023 The Bookclub Authors. Licensed under the MIT licence.
--
-- Case-insensitive e-mail addresses for sign-in.
CREATE EXTENSION IF NOT EXISTS citext;
