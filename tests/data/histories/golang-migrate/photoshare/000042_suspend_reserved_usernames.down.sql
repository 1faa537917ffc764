UPDATE users SET status = 'active' WHERE status = 'suspended';
