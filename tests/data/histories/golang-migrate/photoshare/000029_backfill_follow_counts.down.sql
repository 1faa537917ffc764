UPDATE users SET follower_count = 0, following_count = 0;
